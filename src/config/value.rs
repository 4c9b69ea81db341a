//! How a value of each key's type is written: as text (a `LIVEGATE_*` variable, a flag)
//! and in the TOML file, and what error messages call the expected form. A bad value is
//! reported with where it came from and, unless it is a secret, as it was written.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{ConfigError, Origin, SECRET_KEYS};

/// A value as a layer gives it: text (a variable or a flag) or TOML (the file).
#[derive(Clone, Copy)]
pub(super) enum Raw<'a> {
    Text(&'a str),
    Toml(&'a toml::Value),
}

/// A type a key can have: how its values are written as text and in the file (`None`:
/// not a value of the type), and what error messages call that form.
pub(super) trait Setting: Sized {
    const FORM: &'static str;
    fn from_text(text: &str) -> Option<Self>;
    /// In the file: the text form, as a TOML string.
    fn from_toml(value: &toml::Value) -> Option<Self> {
        value.as_str().and_then(Self::from_text)
    }
}

/// Parses `raw` as the type of `key`, or says what was expected (without echoing a secret).
pub(super) fn parse<T: Setting>(
    key: &'static str,
    raw: Raw<'_>,
    origin: &Origin,
) -> Result<T, ConfigError> {
    let value = match raw {
        Raw::Text(text) => T::from_text(text),
        Raw::Toml(value) => T::from_toml(value),
    };
    value.ok_or_else(|| ConfigError::BadValue {
        origin: origin.clone(),
        expected: expected(T::FORM, key),
        got: match raw {
            _ if SECRET_KEYS.contains(&key) => "a value that is not shown (a secret)".to_string(),
            Raw::Text(text) => format!("{text:?}"),
            Raw::Toml(value) => value.to_string(),
        },
    })
}

const WHOLE: &str = "a whole number";

/// How a value of `key`, of a type written as `form`, is written: a number's unit is the
/// one the key's name ends with.
pub(super) fn expected(form: &'static str, key: &str) -> &'static str {
    match (form, key.rsplit('_').next()) {
        (WHOLE, Some("ms")) => "a whole number of milliseconds",
        (WHOLE, Some("secs")) => "a whole number of seconds",
        (WHOLE, Some("bytes")) => "a whole number of bytes",
        (form, _) => form,
    }
}

/// `Type: form, |text| value from text[, |value| value from TOML];` — without the second,
/// the file writes the text form as a TOML string.
macro_rules! settings {
    ($($ty:ty: $form:expr, |$text:ident| $from_text:expr $(, |$value:ident| $from_toml:expr)?;)*) => {$(
        impl Setting for $ty {
            const FORM: &'static str = $form;
            fn from_text($text: &str) -> Option<Self> {
                $from_text
            }
            $(fn from_toml($value: &toml::Value) -> Option<Self> {
                $from_toml
            })?
        }
    )*};
}

settings! {
    // Up to i64::MAX, the largest number a TOML file (and check-config's output) holds.
    u64: WHOLE, |text| text.trim().parse().ok().filter(|&n| i64::try_from(n).is_ok()), |value| value.as_integer()?.try_into().ok();
    usize: WHOLE, |text| u64::from_text(text)?.try_into().ok(), |value| u64::from_toml(value)?.try_into().ok();
    SocketAddr: "an IP address and port such as 127.0.0.1:7070", |text| text.trim().parse().ok();
    PathBuf: "a path", |text| (!text.is_empty()).then(|| text.into());
    String: "text", |text| Some(text.to_string());
    bool: "true or false", |text| text.trim().parse().ok(), |value| value.as_bool();
    // Comma-separated; in the file also an array of strings.
    Vec<String>: "a comma-separated list",
        |text| Some(text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()),
        |value| match value.as_array() {
            Some(items) => items.iter().map(|item| item.as_str().map(String::from)).collect(),
            None => value.as_str().and_then(Self::from_text),
        };
}

impl<T: Setting> Setting for Option<T> {
    const FORM: &'static str = T::FORM;
    fn from_text(text: &str) -> Option<Self> {
        T::from_text(text).map(Some)
    }
    fn from_toml(value: &toml::Value) -> Option<Self> {
        T::from_toml(value).map(Some)
    }
}
