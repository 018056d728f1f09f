use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn empty_file_is_the_defaults() {
    assert_eq!(
        SluiceConfig::from_toml_str("").expect("parse"),
        SluiceConfig::default()
    );
}

#[test]
fn example_files_parse_to_the_defaults() {
    for (name, text) in [
        (
            "metadata",
            include_str!("../../../metadata/sluice-metadata.example.toml"),
        ),
        (
            "datanode",
            include_str!("../../../datanode/sluice-datanode.example.toml"),
        ),
        (
            "client",
            include_str!("../../../client/sluice-client.example.toml"),
        ),
    ] {
        let parsed =
            SluiceConfig::from_toml_str(text).unwrap_or_else(|e| panic!("{name} example: {e}"));
        assert_eq!(
            parsed,
            SluiceConfig::default(),
            "{name} example drifted from the defaults"
        );
    }
}

#[test]
fn dotted_keys_and_nested_tables_are_the_same() {
    let a = SluiceConfig::from_toml_str(
        "[datanode]\nwrite.buffer.size.bytes = \"4MiB\"\nwrite.memory.buffer.last-replica-only = false\n",
    )
    .expect("parse");
    let b = SluiceConfig::from_toml_str(
        "[datanode.write.buffer.size]\nbytes = 4194304\n[datanode.write.memory.buffer]\nlast-replica-only = false\n",
    )
    .expect("parse");
    assert_eq!(a, b);
    assert_eq!(a.datanode.write_buffer_size, ByteSize::mib(4));
    assert!(!a.datanode.write_buffer_last_replica_only);
}

#[test]
fn unknown_key_and_section_are_named() {
    let err = SluiceConfig::from_toml_str("[datanode]\nwrite.buffer.sise.bytes = 1\n")
        .expect_err("must fail");
    assert_eq!(
        err,
        ConfigError::UnknownKey {
            key: "datanode.write.buffer.sise.bytes".into()
        }
    );
    let err = SluiceConfig::from_toml_str("[datnode]\nport = 1\n").expect_err("must fail");
    assert!(
        matches!(err, ConfigError::UnknownSection { ref section } if section == "datnode"),
        "{err}"
    );
}

#[test]
fn bad_values_name_the_key() {
    let err =
        SluiceConfig::from_toml_str("[client]\nread.mode = \"sideways\"\n").expect_err("must fail");
    assert!(
        matches!(err, ConfigError::BadValue { ref key, .. } if key == "client.read.mode"),
        "{err}"
    );
    let err =
        SluiceConfig::from_toml_str("[metadata]\nlease.hard.limit = 20\n").expect_err("must fail");
    let text = err.to_string();
    assert!(
        text.contains("metadata.lease.hard.limit") && text.contains("no unit"),
        "{text}"
    );
    let err =
        SluiceConfig::from_toml_str("[client]\nwrite.packet.size = 1000\n").expect_err("must fail");
    assert!(
        matches!(err, ConfigError::Invalid { ref key, .. } if key == "client.write.packet.size"),
        "{err}"
    );
}

#[test]
fn environment_overrides_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sluice.toml");
    std::fs::write(
        &path,
        "[datanode]\nwrite.buffer.size.bytes = \"2MiB\"\nport = 1234\n",
    )
    .expect("write");
    let cfg = SluiceConfig::load_with_env(
        Some(&path),
        env(&[
            ("SLUICE_DATANODE__WRITE__BUFFER__SIZE__BYTES", "16MiB"),
            (
                "SLUICE_DATANODE__WRITE__MEMORY__BUFFER__LAST_REPLICA_ONLY",
                "false",
            ),
            ("SLUICE_DATANODE__DATA__DIRS", "/d1,/d2"),
            ("SLUICE_METADATA__DATANODE__DEAD__INTERVAL", "45s"),
            ("SLUICE_METADATA", "127.0.0.1:8020"),
            ("OTHER__THING", "x"),
        ]),
    )
    .expect("load");
    assert_eq!(cfg.datanode.write_buffer_size, ByteSize::mib(16));
    assert!(!cfg.datanode.write_buffer_last_replica_only);
    assert_eq!(cfg.datanode.port, 1234);
    assert_eq!(cfg.datanode.data_dirs.0.len(), 2);
    assert_eq!(cfg.metadata.dead_interval, HumanDuration::secs(45));
}

#[test]
fn unknown_environment_key_is_an_error() {
    let err = SluiceConfig::load_with_env(None, env(&[("SLUICE_CLIENT__READ__MOOD", "stream")]))
        .expect_err("must fail");
    assert_eq!(
        err,
        ConfigError::UnknownKey {
            key: "client.read.mood".into()
        }
    );
}

#[test]
fn missing_file_is_an_error_naming_it() {
    let err = SluiceConfig::load_with_env(Some(Path::new("/nonexistent/sluice.toml")), env(&[]))
        .expect_err("must fail");
    assert!(
        err.to_string().contains("/nonexistent/sluice.toml"),
        "{err}"
    );
}

#[test]
fn write_buffer_permits_follow_the_cap() {
    let mut d = DatanodeConfig::default();
    assert_eq!(d.write_buffer_permits(), Some(128));
    d.write_buffer_size = ByteSize::kib(4);
    assert_eq!(d.effective_write_buffer_size(), 1024 * 1024);
    d.write_buffer_max_capacity_mb = -1;
    assert_eq!(d.write_buffer_permits(), None);
}
