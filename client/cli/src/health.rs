//! `sluice health URL`: a healthcheck probe for images without a shell or curl (the Sluice
//! images are `FROM scratch`). It sends one `GET` over plain HTTP/1.0 and exits 0 when the
//! answer is 2xx (and, with `--require FIELD`, when the JSON body has `FIELD: true`), else 1
//! with one line saying why. Only `http://` URLs; the connection goes exactly where the URL
//! says, nowhere else.
//!
//! Examples (as in `docker-compose.yml`):
//!
//! ```text
//! sluice health http://127.0.0.1:9870/health
//! sluice health http://127.0.0.1:9864/status --require registered
//! ```

use anyhow::{bail, Context as _};
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest answer read; a health or status document is far smaller.
const MAX_RESPONSE: u64 = 1024 * 1024;

/// Options of `sluice health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL to probe, `http://HOST:PORT/PATH` (e.g. a service's `/health` or `/status`).
    pub url: String,
    /// Also require this top-level JSON field of the answer to be `true` (e.g. `registered`
    /// on a DataNode's `/status`).
    #[arg(long, value_name = "FIELD")]
    pub require: Option<String>,
    /// Give up after this long (connect, send and read together).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// An `http://` URL split into what the request needs.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    /// `host:port` to connect to (port 80 if the URL has none).
    authority: String,
    /// The host as written (for the `Host` header).
    host: String,
    /// The path and query, `/` if empty.
    path: String,
}

/// Parses `http://host[:port][/path]`.
fn parse_url(url: &str) -> anyhow::Result<Target> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("only http:// URLs are supported: {url}");
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if hostport.is_empty() {
        bail!("no host in {url}");
    }
    let has_port = match hostport.rfind(':') {
        Some(i) => !hostport[..i].ends_with(':') && hostport.rfind(']').is_none_or(|b| b < i),
        None => false,
    };
    let authority = if has_port {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    Ok(Target {
        authority,
        host: hostport.to_string(),
        path: path.to_string(),
    })
}

/// Sends the request and returns the status code and body.
async fn fetch(t: &Target) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(&t.authority)
        .await
        .with_context(|| format!("cannot connect to {}", t.authority))?;
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: sluice-health\r\nAccept: */*\r\n\r\n",
        t.path, t.host
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .await
        .context("reading the answer")?;
    split_response(&raw)
}

/// Splits an HTTP/1.x answer into its status code and body.
fn split_response(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the answer has no complete HTTP header")?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        bail!("bad status line: {status_line:?}");
    };
    if !version.starts_with("HTTP/1.") {
        bail!("not an HTTP/1.x answer: {status_line:?}");
    }
    let code: u16 = code
        .parse()
        .with_context(|| format!("bad status code in {status_line:?}"))?;
    Ok((code, raw[head_end + 4..].to_vec()))
}

/// Checks a status and body against what was asked; `Err` says why it is unhealthy.
fn judge(code: u16, body: &[u8], require: Option<&str>) -> anyhow::Result<()> {
    if !(200..300).contains(&code) {
        bail!("HTTP status {code}");
    }
    if let Some(field) = require {
        let doc: serde_json::Value =
            serde_json::from_slice(body).context("the answer is not JSON")?;
        match doc.get(field) {
            Some(serde_json::Value::Bool(true)) => {}
            Some(other) => bail!("{field} is {other}, not true"),
            None => bail!("the answer has no field {field}"),
        }
    }
    Ok(())
}

/// Runs the probe: exit 0 and `healthy`, or exit 1 and `unhealthy: <why>`.
pub async fn run(args: &HealthArgs) -> anyhow::Result<ExitCode> {
    let target = parse_url(&args.url)?;
    let outcome = match tokio::time::timeout(args.timeout, fetch(&target)).await {
        Err(_) => Err(anyhow::anyhow!(
            "no answer within {}",
            humantime::format_duration(args.timeout)
        )),
        Ok(Err(e)) => Err(e),
        Ok(Ok((code, body))) => judge(code, &body, args.require.as_deref()),
    };
    match outcome {
        Ok(()) => {
            println!("healthy: {}", args.url);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("unhealthy: {}: {}", args.url, crate::one_line(&e));
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_split_into_authority_host_and_path() {
        let t = parse_url("http://127.0.0.1:9864/status").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str(), t.path.as_str()),
            ("127.0.0.1:9864", "127.0.0.1:9864", "/status")
        );
        let t = parse_url("http://metadata").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("metadata:80", "/")
        );
        let t = parse_url("http://[::1]:9870/health?x=1").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("[::1]:9870", "/health?x=1")
        );
        assert_eq!(parse_url("http://[::1]/").unwrap().authority, "[::1]:80");
        assert!(parse_url("https://a:1/").is_err());
        assert!(parse_url("http:///x").is_err());
    }

    #[test]
    fn responses_are_judged_by_status_and_required_field() {
        let raw = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"registered\":true}";
        let (code, body) = split_response(raw).unwrap();
        assert_eq!(code, 200);
        judge(code, &body, None).unwrap();
        judge(code, &body, Some("registered")).unwrap();
        assert!(judge(code, &body, Some("missing")).is_err());
        let (code, body) =
            split_response(b"HTTP/1.1 200 OK\r\n\r\n{\"registered\":false}").unwrap();
        assert!(judge(code, &body, Some("registered")).is_err());
        assert!(judge(code, b"ok\n", Some("registered")).is_err());
        let (code, body) = split_response(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").unwrap();
        assert!(judge(code, &body, None).is_err());
        assert!(split_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(split_response(b"SSH-2.0-x\r\n\r\n").is_err());
    }

    #[tokio::test]
    async fn a_live_server_is_healthy_and_a_closed_port_is_not() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                assert!(buf[..n].starts_with(b"GET /status HTTP/1.0\r\n"));
                s.write_all(b"HTTP/1.0 200 OK\r\n\r\n{\"registered\":true}")
                    .await
                    .unwrap();
            });
            let t = parse_url(&format!("http://{addr}/status")).unwrap();
            let (code, body) = fetch(&t).await.unwrap();
            judge(code, &body, Some("registered")).unwrap();
            server.await.unwrap();
            // The listener is gone: nothing answers on that port any more.
            assert!(fetch(&t).await.is_err());
        })
        .await
        .unwrap();
    }
}
