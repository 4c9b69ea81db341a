//! The layers of the configuration, later winning: defaults, the TOML file,
//! `LIVEGATE_*` variables, command-line flags; the dev defaults.

use std::path::{Path, PathBuf};

use super::*;

/// `drain_wait_secs` under `serve --dev`, unless set.
pub const DEV_DRAIN_WAIT_SECS: u64 = 1;
/// `drain_spread_secs` under `serve --dev`, unless set.
pub const DEV_DRAIN_SPREAD_SECS: u64 = 1;

impl ConfigFlags {
    /// Sets a key as if its flag were given; panics on a name that is not in [`KEYS`]
    /// (a programming error, not a user's).
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Self {
        let slot = self.slot(name).unwrap_or_else(|| panic!("no configuration key named {name:?}"));
        *slot = Some(value.into());
        self
    }

    /// The value given for a key, as text.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.given().find(|(key, _)| *key == name).map(|(_, text)| text)
    }

    /// The config file to read: `--config`, else `LIVEGATE_CONFIG`, else none.
    pub fn config_file<'a>(
        &self,
        env: impl IntoIterator<Item = &'a (String, String)>,
    ) -> Option<PathBuf> {
        self.config.clone().or_else(|| {
            env.into_iter()
                .find(|(name, value)| name == ENV_CONFIG_FILE && !value.is_empty())
                .map(|(_, value)| PathBuf::from(value))
        })
    }
}

impl Config {
    /// Builds the configuration from its layers, later winning: defaults, the TOML `file`,
    /// `LIVEGATE_<KEY>` variables from `env`, then `flags`; then validates it.
    /// `file` is read as given (see [`ConfigFlags::config_file`] for choosing it).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        Config::load_over(Config::default(), file, env, flags)
    }

    /// [`Config::load`] with `defaults` in place of [`Config::default`]: what a mode such
    /// as `serve --dev` changes, each value still overridden by any layer that sets it.
    pub fn load_over(
        defaults: Config,
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        let mut config = defaults;
        let mut tables = Vec::new();
        // Which layer set each key last, for validation messages.
        let mut origins = BTreeMap::new();
        let mut set = |key: &'static str, raw: Raw<'_>, origin: Origin| {
            config.set(key, raw, &origin)?;
            origins.insert(key, origin);
            Ok::<_, ConfigError>(())
        };
        if let Some(path) = file {
            for (name, value) in &read_file(path)? {
                if name == "namespace" {
                    tables = namespaces::read(path, value)?;
                    continue;
                }
                let Some(key) = KEYS.iter().find(|key| *key == name) else {
                    return Err(ConfigError::UnknownKey {
                        path: path.to_path_buf(),
                        key: name.clone(),
                    });
                };
                set(key, Raw::Toml(value), Origin::File { path: path.to_path_buf(), key })?;
            }
        }
        for (var, text) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else { continue };
            if ENV_NOT_KEYS.contains(&var.as_str()) {
                continue;
            }
            let Some(key) = KEYS.iter().find(|key| key.to_ascii_uppercase() == rest) else {
                tracing::warn!(
                    "ignoring unknown environment variable {var}: livegate has no configuration key {:?}",
                    rest.to_ascii_lowercase()
                );
                continue;
            };
            set(key, Raw::Text(&text), Origin::Env { var })?;
        }
        for (key, text) in flags.given() {
            set(key, Raw::Text(text), Origin::Flag { key })?;
        }
        config.namespaces = tables;
        config.validate().map_err(|e| match e {
            ConfigError::Invalid { key, problem, origin: None } => {
                ConfigError::Invalid { key, problem, origin: origins.remove(key) }
            }
            other => match file {
                Some(path) => other.in_file(path),
                None => other,
            },
        })?;
        Ok(config)
    }

    /// [`Config::load`] with this process's environment and the file named by
    /// `--config` or `LIVEGATE_CONFIG`.
    pub fn load_from_process(flags: &ConfigFlags) -> Result<Config, ConfigError> {
        Config::load_from_process_over(Config::default(), flags)
    }

    /// [`Config::load_from_process`] over `defaults` (see [`Config::load_over`]).
    pub fn load_from_process_over(
        defaults: Config,
        flags: &ConfigFlags,
    ) -> Result<Config, ConfigError> {
        let env = process_env();
        let file = flags.config_file(&env);
        Config::load_over(defaults, file.as_deref(), env, flags)
    }

    /// The defaults of `livegate serve --dev`, for a laptop: a drain of
    /// [`DEV_DRAIN_WAIT_SECS`] spread over [`DEV_DRAIN_SPREAD_SECS`] (Ctrl-C stops in
    /// about two seconds, where the defaults take twenty) and pages from this machine on any
    /// port allowed ([`crate::core::rules::origins::DEV_ORIGINS`]). A key set in any layer wins.
    pub fn dev_defaults() -> Config {
        Config {
            drain_wait_secs: DEV_DRAIN_WAIT_SECS,
            drain_spread_secs: DEV_DRAIN_SPREAD_SECS,
            allowed_origins: crate::core::rules::origins::DEV_ORIGINS
                .iter()
                .map(|o| o.to_string())
                .collect(),
            ..Config::default()
        }
    }
}

/// The config file as a TOML table.
fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::ReadFile { path: path.to_path_buf(), source })?;
    text.parse().map_err(|source: toml::de::Error| {
        // Name the line: "invalid basic string" alone does not say where.
        let line =
            source.span().map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        ConfigError::ParseFile { path: path.to_path_buf(), line, source: Box::new(source) }
    })
}

/// This process's environment as text pairs; variables that are not valid UTF-8 are
/// skipped (with a warning when they look like ours).
fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => Some((name, value)),
            (Ok(name), Err(_)) => {
                if name.starts_with(ENV_PREFIX) {
                    tracing::warn!(
                        "ignoring environment variable {name}: its value is not valid UTF-8"
                    );
                }
                None
            }
            _ => None,
        })
        .collect()
}
