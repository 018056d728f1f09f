//! The special `advertised.host` value [`OWN_IP`] (`@ip`): register this machine's own IP
//! address instead of a name. Meant for containers, whose host names (container ids) mean
//! nothing outside their network, while their bridge IP addresses are reachable both from the
//! other containers and, on Linux, from the host (see `docs/operations.md`).
//!
//! The address is found once, at start-up: first the local address of the route towards the
//! metadata service (a connected UDP socket; connecting one sends no packet), which is the
//! address on the network the DataNode shares with the service; else the first non-loopback
//! address this machine's host name resolves to (Docker writes it to `/etc/hosts`).

use crate::error::{DatanodeError, Result};
use sluice_common::config::{ConfigError, DatanodeConfig};
use std::net::{IpAddr, SocketAddr, UdpSocket};

/// `advertised.host = "@ip"`: advertise this machine's IP address (see the module doc).
pub const OWN_IP: &str = "@ip";

/// Replaces `advertised.host = "@ip"` in `cfg` with the address found; any other value is left
/// as it is. Fails, naming the key, when no usable address is found.
pub async fn resolve(cfg: &mut DatanodeConfig) -> Result<()> {
    if cfg.advertised_host != OWN_IP {
        return Ok(());
    }
    let (ip, via) = match route_towards(&cfg.metadata_address).await {
        Some(ip) => (ip, "route to the metadata service"),
        None => match host_name_ip().await {
            Some(ip) => (ip, "host name"),
            None => {
                return Err(DatanodeError::Config(ConfigError::invalid(
                    "datanode.advertised.host",
                    OWN_IP,
                    format!(
                        "no IP address found: no route to the metadata service at {} and the \
                         host name does not resolve to a non-loopback address",
                        cfg.metadata_address
                    ),
                )))
            }
        },
    };
    tracing::info!(%ip, via, "advertising this machine's IP address");
    cfg.advertised_host = ip.to_string();
    Ok(())
}

/// The local address a packet to the metadata service would leave from (none if the name does
/// not resolve, or the answer is unspecified).
async fn route_towards(metadata: &str) -> Option<IpAddr> {
    let target: SocketAddr = tokio::net::lookup_host(metadata).await.ok()?.next()?;
    let local: SocketAddr = if target.is_ipv4() {
        ([0u8, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let socket = UdpSocket::bind(local).ok()?;
    socket.connect(target).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// The first non-loopback address of this machine's host name, IPv4 first.
async fn host_name_ip() -> Option<IpAddr> {
    let name = crate::sys::host_name()?;
    let addrs: Vec<IpAddr> = tokio::net::lookup_host((name.as_str(), 0))
        .await
        .ok()?
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .collect();
    addrs
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn own_ip_is_the_route_towards_the_metadata_service() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let mut cfg = DatanodeConfig {
                metadata_address: "127.0.0.1:8020".into(),
                advertised_host: OWN_IP.into(),
                ..DatanodeConfig::default()
            };
            resolve(&mut cfg).await.unwrap();
            assert_eq!(cfg.advertised_host, "127.0.0.1");
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn other_values_are_left_alone() {
        tokio::time::timeout(Duration::from_secs(20), async {
            for host in ["", "dn1.example", "10.0.0.7", "ip"] {
                let mut cfg = DatanodeConfig {
                    advertised_host: host.into(),
                    ..DatanodeConfig::default()
                };
                resolve(&mut cfg).await.unwrap();
                assert_eq!(cfg.advertised_host, host);
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn an_unusable_metadata_address_falls_back_to_the_host_name() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let mut cfg = DatanodeConfig {
                // No port: refused before any name lookup, so only the host name is left.
                metadata_address: "no-port-here".into(),
                advertised_host: OWN_IP.into(),
                ..DatanodeConfig::default()
            };
            match resolve(&mut cfg).await {
                Ok(()) => {
                    let ip: IpAddr = cfg.advertised_host.parse().unwrap();
                    assert!(!ip.is_loopback());
                }
                // A machine whose name only maps to loopback has nothing to advertise.
                Err(e) => assert!(e.to_string().contains("datanode.advertised.host"), "{e}"),
            }
        })
        .await
        .unwrap();
    }
}
