//! Configuration files: TOML, unknown keys rejected (structs use `deny_unknown_fields`), and
//! every error names the file and the key.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::ConfigError;

/// A value that parsed but is out of range: which field (dotted path) and why.
///
/// The one validation error of every config struct: a struct names its fields relative to
/// itself and each parent prefixes its own key with [`Invalid::within`], so the error that
/// reaches the user names the full TOML key path (`grpo.advantage.vg_tau`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    /// Dotted path of the field, e.g. `expert.samples`.
    pub field: String,
    /// What is allowed.
    pub message: String,
}

impl Invalid {
    /// An `Invalid` for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Prefixes the field path with a parent table, e.g. `samples` -> `expert.samples`.
    pub fn within(mut self, table: &str) -> Self {
        self.field = format!("{table}.{}", self.field);
        self
    }
}

/// Range checks run after parsing. Implement it for every config struct.
pub trait Validate {
    /// Returns the first invalid field, if any, named relative to `self` (a nested struct's
    /// error is prefixed with the key of the field holding it, [`Invalid::within`]).
    fn validate(&self) -> Result<(), Invalid>;
}

/// `Ok` when `ok`, else an [`Invalid`] for `field`.
pub fn ensure(ok: bool, field: &str, message: impl Into<String>) -> Result<(), Invalid> {
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(field, message))
    }
}

/// `Ok` when `r` is a finite range `[lo, hi]` with `min <= lo <= hi <= max`, else an
/// [`Invalid`] for `field` saying so (domain-randomisation ranges).
pub fn ensure_range(r: [f64; 2], field: &str, min: f64, max: f64) -> Result<(), Invalid> {
    ensure(
        r[0].is_finite() && r[1].is_finite() && r[0] >= min && r[0] <= r[1] && r[1] <= max,
        field,
        format!("must be a range [lo, hi] with {min} <= lo <= hi <= {max}, got {r:?}"),
    )
}

/// Parses and validates a config from TOML text; `origin` names it in errors.
pub fn from_toml_str<T: DeserializeOwned + Validate>(
    text: &str,
    origin: &Path,
) -> Result<T, ConfigError> {
    let parse_err = |key: String, e: toml::de::Error| {
        let mut message = e.message().trim().to_string();
        if let Some(span) = e.span() {
            let (line, col) = line_col(text, span.start);
            message = format!("{message} (line {line}, column {col})");
        }
        ConfigError::Parse {
            path: origin.to_path_buf(),
            key,
            message,
        }
    };
    let de = toml::Deserializer::parse(text).map_err(|e| parse_err(".".into(), e))?;
    let value: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        parse_err(key, e.into_inner())
    })?;
    value.validate().map_err(|i| ConfigError::Invalid {
        path: origin.to_path_buf(),
        field: i.field,
        message: i.message,
    })?;
    Ok(value)
}

/// Reads, parses and validates a config file.
pub fn load<T: DeserializeOwned + Validate>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_toml_str(&text, path)
}

/// The origin used for configs embedded in the binary.
pub fn embedded(name: &str) -> PathBuf {
    PathBuf::from(format!("<embedded {name}>"))
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        samples: usize,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Cfg {
        name: String,
        inner: Inner,
    }

    impl Validate for Cfg {
        fn validate(&self) -> Result<(), Invalid> {
            ensure(
                self.inner.samples > 0,
                "inner.samples",
                "must be at least 1",
            )
        }
    }

    fn parse(text: &str) -> Result<Cfg, ConfigError> {
        from_toml_str(text, Path::new("configs/x.toml"))
    }

    #[test]
    fn good_config_parses() {
        let c = parse("name = \"a\"\n[inner]\nsamples = 3\n").unwrap();
        assert_eq!((c.name.as_str(), c.inner.samples), ("a", 3));
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let e = parse("name = \"a\"\n[inner]\nsamples = 3\nsampels = 4\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("configs/x.toml") && e.contains("sampels") && e.contains("inner"),
            "{e}"
        );
        assert!(e.contains("line 4"), "{e}");
    }

    #[test]
    fn wrong_type_names_key() {
        let e = parse("name = \"a\"\n[inner]\nsamples = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("inner.samples") && e.contains("configs/x.toml"),
            "{e}"
        );
    }

    #[test]
    fn invalid_value_names_field() {
        let e = parse("name = \"a\"\n[inner]\nsamples = 0\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "configs/x.toml: inner.samples: must be at least 1");
    }

    #[test]
    fn syntax_error_and_missing_file() {
        assert!(
            parse("name = \n")
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        let e = load::<Cfg>(Path::new("/nonexistent/c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/c.toml"), "{e}");
    }
}
