//! Sizes and durations written the way people write them: `"8MiB"`, `"64 KiB"`, `"10s"`,
//! `"500ms"`, `"10m 30s"`.

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A size in bytes. Accepts an integer (bytes) or a string with a unit: `B`, `KiB`, `MiB`,
/// `GiB`, `TiB` (powers of 1024; `K`, `M`, `G`, `T`, `k`, `m`, `g`, `t` too, as Hadoop) or
/// `KB`, `MB`, `GB`, `TB` (powers of 1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` KiB.
    pub const fn kib(n: u64) -> Self {
        ByteSize(n * 1024)
    }
    /// `n` MiB.
    pub const fn mib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024)
    }
    /// `n` GiB.
    pub const fn gib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024 * 1024)
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
    /// The size in bytes as `usize` (saturating).
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }

    /// Parses `"8MiB"`, `"64 KiB"`, `"1g"`, `"1000"`.
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = (s[..split].trim(), s[split..].trim());
        if num.is_empty() {
            return Err(format!(
                "{s:?} is not a size (expected e.g. \"8MiB\" or 4096)"
            ));
        }
        let mult: u64 = match unit {
            "" | "B" | "b" => 1,
            "K" | "k" | "KiB" | "kiB" => 1 << 10,
            "M" | "m" | "MiB" => 1 << 20,
            "G" | "g" | "GiB" => 1 << 30,
            "T" | "t" | "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => {
                return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
            }
        };
        let bytes = if num.contains('.') {
            let f: f64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
            (f * mult as f64).round() as u64
        } else {
            let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
            n.checked_mul(mult)
                .ok_or_else(|| format!("{s:?} is too large"))?
        };
        Ok(ByteSize(bytes))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{}", self.0 / size, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

/// Formats a byte count for people: `1.5 GiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes as an integer, or a string such as \"8MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative ({v})")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration written with units (`"10s"`, `"500ms"`, `"10m 30s"`). A bare number is refused,
/// because its unit would be a guess.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// `n` seconds.
    pub const fn secs(n: u64) -> Self {
        HumanDuration(Duration::from_secs(n))
    }
    /// `n` milliseconds.
    pub const fn millis(n: u64) -> Self {
        HumanDuration(Duration::from_millis(n))
    }
    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration with a unit, such as \"10s\" or \"500ms\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(v.trim())
                    .map(HumanDuration)
                    .map_err(|e| {
                        E::custom(format!("{v:?} is not a duration ({e}); write e.g. \"10s\""))
                    })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "{v} has no unit: write a duration such as \"{v}s\" or \"{v}ms\""
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                self.visit_u64(v.unsigned_abs())
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration for keys named `*.ms`: an integer counts milliseconds; a string takes units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub Duration);

impl Millis {
    /// `n` milliseconds.
    pub const fn new(n: u64) -> Self {
        Millis(Duration::from_millis(n))
    }
    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0.as_millis() as u64)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Millis;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("milliseconds as an integer, or a duration such as \"2s\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Millis, E> {
                Ok(Millis::new(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Millis, E> {
                u64::try_from(v)
                    .map(Millis::new)
                    .map_err(|_| E::custom(format!("a duration cannot be negative ({v})")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Millis, E> {
                humantime::parse_duration(v.trim())
                    .map(Millis)
                    .map_err(|e| E::custom(format!("{v:?} is not a duration ({e})")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of paths: a TOML array, or one string with comma-separated entries (handy in
/// environment variables and command-line flags).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PathList(pub Vec<std::path::PathBuf>);

impl PathList {
    /// Splits a comma-separated list, dropping empty entries.
    pub fn parse(s: &str) -> PathList {
        PathList(
            s.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(std::path::PathBuf::from)
                .collect(),
        )
    }
}

impl Serialize for PathList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl<'de> Deserialize<'de> for PathList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = PathList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of paths, or a comma-separated string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PathList, E> {
                Ok(PathList::parse(v))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<PathList, A::Error> {
                let mut out = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    out.push(std::path::PathBuf::from(p));
                }
                Ok(PathList(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_human_units() {
        assert_eq!(ByteSize::parse("8MiB"), Ok(ByteSize::mib(8)));
        assert_eq!(ByteSize::parse("64 KiB"), Ok(ByteSize::kib(64)));
        assert_eq!(ByteSize::parse("1g"), Ok(ByteSize::gib(1)));
        assert_eq!(ByteSize::parse("1MB"), Ok(ByteSize(1_000_000)));
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("1.5KiB"), Ok(ByteSize(1536)));
        assert!(ByteSize::parse("8 parsecs").is_err());
        assert!(ByteSize::parse("MiB").is_err());
        assert_eq!(ByteSize::mib(8).to_string(), "8MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn durations_need_units_except_millis() {
        let d: HumanDuration = serde_json::from_str("\"10m 30s\"").expect("parse");
        assert_eq!(d.get(), Duration::from_secs(630));
        let err = serde_json::from_str::<HumanDuration>("10").expect_err("must fail");
        assert!(err.to_string().contains("has no unit"), "{err}");
        let m: Millis = serde_json::from_str("2000").expect("parse");
        assert_eq!(m.get(), Duration::from_secs(2));
        let m: Millis = serde_json::from_str("\"3s\"").expect("parse");
        assert_eq!(m.get(), Duration::from_secs(3));
    }

    #[test]
    fn path_lists_from_strings_and_arrays() {
        let p: PathList = serde_json::from_str("\"/a, /b,\"").expect("parse");
        assert_eq!(p.0.len(), 2);
        let p: PathList = serde_json::from_str("[\"/a\"]").expect("parse");
        assert_eq!(p.0, vec![std::path::PathBuf::from("/a")]);
    }
}
