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

#[test]
fn log_section_selects_json_lines_and_colour() {
    let cfg = SluiceConfig::from_toml_str("[log]\nformat = \"json\"\ncolor = \"never\"\n")
        .expect("parse");
    assert_eq!(cfg.log.format, LogFormat::Json);
    assert_eq!(cfg.log.color, ColorMode::Never);
    let cfg =
        SluiceConfig::load_with_env(None, env(&[("SLUICE_LOG__FORMAT", "json")])).expect("env");
    assert_eq!(cfg.log.format, LogFormat::Json);
    assert_eq!(cfg.log.color, ColorMode::Auto);
    let err = SluiceConfig::from_toml_str("[log]\nformat = \"xml\"\n").expect_err("bad format");
    assert!(err.to_string().contains("format"), "{err}");
}

/// The key rows (`| `key` | default | meaning |`) of each `## `[section]`` of
/// docs/configuration.md: section → [(key, default cell)].
fn documented_keys() -> std::collections::BTreeMap<String, Vec<(String, String)>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let text = std::fs::read_to_string(&path).expect("read docs/configuration.md");
    let mut out: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
    let mut section = None;
    // The column of the defaults in the current table (its header names it `default`).
    let mut column = 1;
    for line in text.lines() {
        if line.starts_with("| key |") {
            let headers: Vec<&str> = line.split('|').map(str::trim).skip(1).collect();
            column = headers.iter().position(|h| *h == "default").unwrap_or(1);
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            section = h
                .trim()
                .strip_prefix("`[")
                .and_then(|s| s.strip_suffix("]`"))
                .map(str::to_string);
            continue;
        }
        let (Some(section), Some(row)) = (&section, line.strip_prefix("| `")) else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let key = cells
            .first()
            .copied()
            .unwrap_or_default()
            .trim_end_matches('`');
        let default = cells.get(column).copied().unwrap_or_default();
        out.entry(section.clone())
            .or_default()
            .push((key.to_string(), default.to_string()));
    }
    out
}

/// A default cell as a value: `(empty)` is the empty string; backticks and a trailing `(...)`
/// remark dropped; JSON when it parses as JSON (numbers, booleans, lists), else the text.
fn default_value(cell: &str) -> Value {
    if cell == "(empty)" {
        return Value::String(String::new());
    }
    let text = cell.replace('`', "");
    let text = text.split(" (").next().unwrap_or_default().trim();
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// Checks one section: every key of `T`'s defaults is documented, every documented key exists,
/// and each documented default, read back as that key's value, gives the section's default.
fn check_section<T>(section: &str, documented: &[(String, String)], problems: &mut Vec<String>)
where
    T: serde::Serialize + DeserializeOwned + Default + PartialEq + std::fmt::Debug,
{
    let Value::Object(defaults) = serde_json::to_value(T::default()).expect("serialize") else {
        panic!("[{section}] does not serialize to a table");
    };
    for key in defaults.keys() {
        if !documented.iter().any(|(k, _)| k == key) {
            problems.push(format!("[{section}] {key} is not in docs/configuration.md"));
        }
    }
    for (key, cell) in documented {
        if !defaults.contains_key(key) {
            problems.push(format!("[{section}] {key} is documented but is no key"));
            continue;
        }
        let value = default_value(cell);
        let parse = |v: Value| {
            let mut one = Map::new();
            one.insert(key.clone(), v);
            serde_json::from_value::<T>(Value::Object(one)).ok()
        };
        // A number-looking default may be a string-typed key (a port list, a size): try both.
        let read = parse(value.clone()).or_else(|| parse(Value::String(cell.replace('`', ""))));
        match read {
            Some(t) if t == T::default() => {}
            Some(_) => problems.push(format!(
                "[{section}] {key}: the documented default {cell} is not the default {}",
                defaults[key]
            )),
            None => problems.push(format!(
                "[{section}] {key}: the documented default {cell} does not parse"
            )),
        }
    }
}

#[test]
fn the_reference_lists_every_key_with_its_default() {
    let docs = documented_keys();
    let mut problems = Vec::new();
    let none = Vec::new();
    let rows = |s: &str| docs.get(s).unwrap_or(&none);
    check_section::<MetadataConfig>("metadata", rows("metadata"), &mut problems);
    check_section::<DatanodeConfig>("datanode", rows("datanode"), &mut problems);
    check_section::<ClientConfig>("client", rows("client"), &mut problems);
    check_section::<LogConfig>("log", rows("log"), &mut problems);
    assert!(
        problems.is_empty(),
        "docs/configuration.md is out of date:\n{}",
        problems.join("\n")
    );
}
