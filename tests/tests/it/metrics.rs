//! `/metrics` of both services (docs/metrics.md) on a MiniCluster, after a write, a read-back and a
//! DataNode killed under an open writer: each exposition parses as Prometheus text format
//! 0.0.4 (checked line by line here, histograms included), every family exposed is listed in
//! `docs/metrics.md` with the same type and every listed one is exposed, and the values agree
//! with what happened (bytes written ≥ file size × 3 across the DataNodes, files, blocks and
//! capacity as the cluster report says, one DataNode dead, the pipeline recovery counted on
//! both sides, every packet's ack timed, every fsync timed).

use sluice_client::WriteOptions;
use sluice_tests::http::request;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const LIMIT: Duration = Duration::from_secs(120);
const BLOCK: u64 = 128 * 1024;

/// One sample: its name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One family: its `# TYPE` and its samples.
#[derive(Debug, Default, Clone)]
struct Family {
    kind: String,
    samples: Vec<Sample>,
}

/// A parsed exposition, by family name.
type Families = BTreeMap<String, Family>;

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad value {s:?}")),
    }
}

/// `k="v",...}` (after the `{`): the labels and the rest of the line.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let eq = s.find('=').ok_or("label without =")?;
        let key = &s[..eq];
        if !valid_name(key) || key.contains(':') {
            return Err(format!("bad label name {key:?}"));
        }
        let mut chars = s[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err("label value not quoted".into());
        }
        let mut value = String::new();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("bad escape \\{c}")),
                },
                (i, '"') => break eq + 1 + i + 1,
                (_, c) => value.push(c),
            }
        };
        if labels.insert(key.to_string(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        s = &s[end..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// The family a sample name belongs to, given the family being read.
fn belongs(sample: &str, family: &str, kind: &str) -> bool {
    match kind {
        "histogram" => [
            format!("{family}_bucket"),
            format!("{family}_sum"),
            format!("{family}_count"),
        ]
        .iter()
        .any(|n| n == sample),
        _ => sample == family,
    }
}

/// Parses the Prometheus text format strictly: HELP and TYPE before a family's samples, one
/// TYPE per family, every sample inside the family declared last, valid names, labels and
/// values, counters not negative, histogram buckets cumulative up to `+Inf` = `_count`.
fn parse(text: &str) -> Result<Families, String> {
    let mut families = Families::new();
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| err("TYPE".into()))?;
            if !valid_name(name)
                || !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind)
            {
                return Err(err("bad TYPE".into()));
            }
            if families.contains_key(name) {
                return Err(err("family declared twice".into()));
            }
            families.insert(
                name.to_string(),
                Family {
                    kind: kind.to_string(),
                    samples: Vec::new(),
                },
            );
            current = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name) {
                return Err(err("bad HELP".into()));
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(l) => parse_labels(l).map_err(err)?,
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let mut fields = rest.split_whitespace();
        let value =
            parse_value(fields.next().ok_or_else(|| err("no value".into()))?).map_err(err)?;
        if fields.nth(1).is_some() {
            return Err(err("trailing fields".into()));
        }
        let fam_name = current
            .as_ref()
            .ok_or_else(|| err("sample before any TYPE".into()))?;
        let fam = families
            .get_mut(fam_name)
            .ok_or_else(|| err("no family".into()))?;
        if !valid_name(name) || !belongs(name, fam_name, &fam.kind) {
            return Err(err(format!("sample outside its family {fam_name}")));
        }
        if fam.kind == "counter" && value < 0.0 {
            return Err(err("negative counter".into()));
        }
        fam.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    for (name, fam) in &families {
        if fam.kind == "histogram" {
            check_histogram(name, fam)?;
        }
    }
    Ok(families)
}

/// A histogram series: its labels but `le`.
type SeriesKey = Vec<(String, String)>;

/// Buckets by label set (without `le`): ascending bounds, cumulative counts, `+Inf` = `_count`.
fn check_histogram(name: &str, fam: &Family) -> Result<(), String> {
    let mut series: BTreeMap<SeriesKey, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<SeriesKey, f64> = BTreeMap::new();
    for s in &fam.samples {
        let mut key: SeriesKey = s.labels.clone().into_iter().collect();
        key.retain(|(k, _)| k != "le");
        if s.name.ends_with("_bucket") {
            let le = s
                .labels
                .get("le")
                .ok_or(format!("{name}: bucket without le"))?;
            series
                .entry(key)
                .or_default()
                .push((parse_value(le)?, s.value));
        } else if s.name.ends_with("_count") {
            counts.insert(key, s.value);
        }
    }
    for (key, buckets) in &series {
        let ordered = buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
        let last = buckets.last().ok_or(format!("{name}: no bucket"))?;
        if !ordered || last.0 != f64::INFINITY || counts.get(key) != Some(&last.1) {
            return Err(format!(
                "{name}{key:?}: buckets {buckets:?}, count {:?}",
                counts.get(key)
            ));
        }
    }
    Ok(())
}

/// The value of `name` with exactly `labels` (0 if absent).
fn value(f: &Families, name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    f.values()
        .flat_map(|fam| &fam.samples)
        .find(|s| s.name == name && s.labels == want)
        .map_or(0.0, |s| s.value)
}

/// The sum of `name` (no labels) over several expositions.
fn sum(all: &[Families], name: &str) -> f64 {
    all.iter().map(|f| value(f, name, &[])).sum()
}

/// `GET /metrics` at `addr`, parsed.
async fn scrape(addr: impl std::fmt::Display) -> Families {
    let r = request("GET", &format!("http://{addr}/metrics"), b"")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{:?}",
        r.header("content-type")
    );
    let text = String::from_utf8(r.body).unwrap();
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// docs/metrics.md: section title → {family name → type}.
fn documented() -> BTreeMap<String, BTreeMap<String, String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let text = std::fs::read_to_string(&path).expect("read docs/metrics.md");
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title.to_string();
        } else if let Some(row) = line.strip_prefix("| `") {
            let (name, rest) = row.split_once('`').unwrap();
            let kind = rest
                .trim_start_matches(" |")
                .split('|')
                .next()
                .unwrap()
                .trim();
            let dup = out
                .entry(section.clone())
                .or_default()
                .insert(name.to_string(), kind.to_string());
            assert!(dup.is_none(), "{name} listed twice in docs/metrics.md");
        }
    }
    out
}

/// Every family exposed is documented with its type, and every documented one is exposed.
fn check_documented(service: &str, exposed: &Families, docs: &BTreeMap<String, String>) {
    let got: BTreeMap<&str, &str> = exposed
        .iter()
        .map(|(n, f)| (n.as_str(), f.kind.as_str()))
        .collect();
    let want: BTreeMap<&str, &str> = docs.iter().map(|(n, k)| (n.as_str(), k.as_str())).collect();
    let undocumented: BTreeSet<_> = got.keys().filter(|n| !want.contains_key(*n)).collect();
    let missing: BTreeSet<_> = want.keys().filter(|n| !got.contains_key(*n)).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "{service}: exposed but not in docs/metrics.md: {undocumented:?}; documented but not \
         exposed: {missing:?}"
    );
    for (name, kind) in &got {
        assert_eq!(
            want[name], *kind,
            "{service}: {name} has another type in the docs"
        );
    }
}

fn opts() -> WriteOptions {
    WriteOptions {
        block_size: Some(BLOCK),
        create_parent: true,
        ..WriteOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_expositions_parse_are_documented_and_agree_with_what_happened() {
    with_timeout(LIMIT, "metrics", async {
        sluice_tests::init_logging();
        let mut c = MiniCluster::builder()
            .datanodes(4)
            .heartbeat(Duration::from_millis(200))
            .liveness(Duration::from_secs(1), Duration::from_secs(2))
            .start()
            .await
            .unwrap();
        c.wait_live(4).await.unwrap();
        let fs = c.client().await.unwrap();
        let size = 300_000usize;
        let data = random_bytes(size, 21);
        write_all(&fs, "/m/a", &data, opts(), 64 * 1024)
            .await
            .unwrap();
        assert_eq!(read_all(&fs, "/m/a").await.unwrap(), data);

        // Every DataNode, before one is killed. The connections end just after the client
        // has its answers: wait for their timers.
        let dn_addrs: Vec<_> = (0..4).map(|i| c.datanode(i).unwrap().http_addr()).collect();
        let scrape_all = || async {
            let mut all = Vec::new();
            for a in &dn_addrs {
                all.push(scrape(a).await);
            }
            all
        };
        let all_timed = |dns: &[Families]| {
            let reads = sum(dns, "sluice_datanode_read_block_ops_total")
                + sum(dns, "sluice_datanode_read_chunk_ops_total");
            let timed: f64 = dns
                .iter()
                .map(|f| {
                    let count = "sluice_datanode_read_request_seconds_count";
                    value(f, count, &[("mode", "stream")]) + value(f, count, &[("mode", "chunk")])
                })
                .sum();
            sum(dns, "sluice_datanode_block_write_seconds_count")
                == sum(dns, "sluice_datanode_write_block_ops_total")
                && reads >= 1.0
                && timed == reads
        };
        wait_until(LIMIT, "every WriteBlock and read timed", || async {
            all_timed(&scrape_all().await)
        })
        .await;
        let dns = scrape_all().await;
        assert!(all_timed(&dns));
        let blocks = size.div_ceil(BLOCK as usize) as f64;
        assert!(sum(&dns, "sluice_datanode_written_bytes_total") >= (size * 3) as f64);
        assert!(sum(&dns, "sluice_datanode_write_block_ops_total") >= blocks * 3.0);
        assert!(sum(&dns, "sluice_datanode_read_bytes_total") >= size as f64);
        let packets = sum(&dns, "sluice_datanode_packets_received_total");
        assert!(packets >= blocks * 3.0);
        assert_eq!(
            sum(&dns, "sluice_datanode_packet_ack_seconds_count"),
            packets,
            "every packet's ack timed"
        );
        assert_eq!(
            sum(&dns, "sluice_datanode_fsyncs_total"),
            2.0 * sum(&dns, "sluice_datanode_fsync_seconds_count"),
            "each replica sync (block + meta file) timed once"
        );
        assert_eq!(
            sum(&dns, "sluice_datanode_flush_seconds_count"),
            sum(&dns, "sluice_datanode_buffer_flushes_total")
        );
        assert!(
            sum(&dns, "sluice_datanode_buffer_flushes_total") >= blocks,
            "the last replicas were buffered"
        );
        assert_eq!(
            sum(&dns, "sluice_datanode_prefetch_hits_total")
                + sum(&dns, "sluice_datanode_prefetch_misses_total")
                + sum(&dns, "sluice_datanode_stream_pieces_cached_total"),
            sum(&dns, "sluice_datanode_pieces_sent_total"),
            "every piece sent came from the page cache on the connection task or from the reader"
        );
        assert_eq!(sum(&dns, "sluice_datanode_active_pipelines"), 0.0);
        let mut used = 0.0;
        for (i, f) in dns.iter().enumerate() {
            let vols = &f["sluice_datanode_volume_capacity_bytes"].samples;
            assert_eq!(vols.len(), 1, "DataNode {i}: one volume");
            assert!(vols[0].value > 0.0 && vols[0].labels.contains_key("volume"));
            used += f["sluice_datanode_volume_used_bytes"].samples[0].value;
        }
        assert!(used >= (size * 3) as f64, "replicas on the volumes: {used}");

        // A DataNode of an open writer's pipeline killed: the writer recovers its pipeline.
        let mut w = fs.create("/m/b", opts()).await.unwrap();
        w.write_all(&random_bytes(100_000, 22)).await.unwrap();
        w.hflush().await.unwrap();
        let victim_id = w.pipeline()[1].clone();
        let victim = c.datanode_index_by_id(&victim_id.node_id).unwrap();
        c.kill_datanode(victim);
        w.write_all(&random_bytes(100_000, 23)).await.unwrap();
        w.close().await.unwrap();
        assert!(w.pipeline_recoveries() >= 1);

        let meta_addr = c.metadata_http_addr().unwrap();
        wait_until(
            LIMIT,
            "the metadata service counts one DataNode dead",
            || async {
                value(
                    &scrape(meta_addr).await,
                    "sluice_metadata_datanodes",
                    &[("state", "dead")],
                ) == 1.0
            },
        )
        .await;
        let meta = scrape(meta_addr).await;
        let report = fs.cluster_report().await.unwrap();
        assert_eq!(
            value(&meta, "sluice_metadata_datanodes", &[("state", "live")]),
            3.0
        );
        assert_eq!(value(&meta, "sluice_metadata_files", &[]), 2.0);
        assert_eq!(
            value(&meta, "sluice_metadata_files", &[]),
            report.files as f64
        );
        assert_eq!(
            value(&meta, "sluice_metadata_directories", &[]),
            report.directories as f64
        );
        assert_eq!(
            value(&meta, "sluice_metadata_blocks", &[]),
            report.blocks as f64
        );
        assert_eq!(
            value(&meta, "sluice_metadata_capacity_bytes", &[]),
            report.totals().capacity as f64
        );
        assert_eq!(
            value(&meta, "sluice_metadata_files_under_construction", &[]),
            0.0
        );
        let recoveries = value(&meta, "sluice_metadata_pipeline_recoveries_total", &[]);
        assert!(
            recoveries >= 1.0 && recoveries <= w.pipeline_recoveries() as f64,
            "{recoveries}"
        );
        assert_eq!(
            value(
                &meta,
                "sluice_metadata_rpc_calls_total",
                &[("method", "create")]
            ),
            2.0
        );
        assert_eq!(
            value(
                &meta,
                "sluice_metadata_rpc_duration_seconds_count",
                &[("method", "create")]
            ),
            2.0
        );
        assert!(
            value(
                &meta,
                "sluice_metadata_rpc_calls_total",
                &[("method", "heartbeat")]
            ) > 0.0
        );
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            value(&meta, "sluice_build_info", &[("version", version)]),
            1.0
        );
        assert!(value(&meta, "process_resident_memory_bytes", &[]) > 0.0);
        assert!(value(&meta, "process_open_fds", &[]) > 0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value(&meta, "process_start_time_seconds", &[]);
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );

        // The survivors: the recovery seen on the DataNode side too.
        let mut live = Vec::new();
        for (i, a) in dn_addrs.iter().enumerate().filter(|(i, _)| *i != victim) {
            let f = scrape(a).await;
            assert_eq!(
                value(&f, "sluice_build_info", &[("version", version)]),
                1.0,
                "DataNode {i}"
            );
            live.push(f);
        }
        assert!(sum(&live, "sluice_datanode_pipeline_recoveries_total") >= 1.0);

        // docs/metrics.md against both expositions.
        let docs = documented();
        let section = |title: &str| {
            docs.get(title)
                .cloned()
                .unwrap_or_else(|| panic!("no '## {title}'"))
        };
        let both = section("Both services");
        let mut meta_docs = section("Metadata service");
        meta_docs.extend(both.clone());
        let mut dn_docs = section("DataNode");
        dn_docs.extend(both);
        check_documented("metadata", &meta, &meta_docs);
        for (i, f) in live.iter().enumerate() {
            check_documented(&format!("DataNode {i}"), f, &dn_docs);
        }
        c.shutdown().await;
    })
    .await;
}

#[test]
fn the_parser_refuses_what_prometheus_refuses() {
    let ok = "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v\\\"\"} 1\n\
              # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n";
    let f = parse(ok).unwrap();
    assert_eq!(f["a_total"].samples[0].labels["k"], "v\"");
    for bad in [
        "a 1\n",                            // no TYPE
        "# TYPE a gauge\nb 1\n",            // outside its family
        "# TYPE a gauge\na{k=v} 1\n",       // unquoted
        "# TYPE a gauge\na one\n",          // not a number
        "# TYPE a counter\na -1\n",         // negative counter
        "# TYPE a gauge\n# TYPE a gauge\n", // declared twice
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n",
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
}
