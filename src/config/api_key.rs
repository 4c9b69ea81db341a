//! The API key backends present: the configured `api_key`, else a key generated once
//! into `data_dir/api_key` (mode 0600) and read from there by the server and the clients.

use std::path::PathBuf;

use super::{Config, ConfigError, API_KEY_MIN_CHARS};

/// The API key to use, and where it was written when it was generated just now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedApiKey {
    pub key: String,
    /// `Some(path)` when no key existed and a new one was generated and stored there.
    pub generated_at: Option<PathBuf>,
}

impl Config {
    /// Where the API key is stored when it is not configured: `data_dir/api_key`.
    pub fn api_key_path(&self) -> PathBuf {
        self.data_dir.join("api_key")
    }

    /// The API key without generating one: the configured key, else the trimmed contents
    /// of [`Config::api_key_path`] when that file exists, else `None`.
    /// Client commands use this: they must never invent a key the server does not know.
    pub fn existing_api_key(&self) -> Result<Option<String>, ConfigError> {
        if let Some(key) = &self.api_key {
            return Ok(Some(key.clone()));
        }
        let path = self.api_key_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => check_stored_key(path, &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ConfigError::ApiKeyFile { path, source }),
        }
    }

    /// The API key the server uses: [`Config::existing_api_key`], else a new random key
    /// (32 bytes, base64url without padding) written to [`Config::api_key_path`] with mode
    /// 0600, creating `data_dir` if needed.
    pub fn resolve_api_key(&self) -> Result<ResolvedApiKey, ConfigError> {
        if let Some(key) = self.existing_api_key()? {
            return Ok(ResolvedApiKey { key, generated_at: None });
        }
        let path = self.api_key_path();
        let file_error = |source| ConfigError::ApiKeyFile { path: path.clone(), source };
        std::fs::create_dir_all(&self.data_dir).map_err(|source| ConfigError::DataDir {
            path: path.clone(),
            dir: self.data_dir.clone(),
            source,
        })?;
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).map_err(ConfigError::Random)?;
        let key = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes);

        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // create_new: if another process wrote a key in the meantime, use that one.
        let mut file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(&path).map_err(file_error)?;
                let key = check_stored_key(path, &text)?;
                return Ok(ResolvedApiKey { key, generated_at: None });
            }
            Err(e) => return Err(file_error(e)),
        };
        file.write_all(format!("{key}\n").as_bytes()).map_err(file_error)?;
        file.sync_all().map_err(file_error)?;
        Ok(ResolvedApiKey { key, generated_at: Some(path) })
    }
}

fn check_stored_key(path: PathBuf, text: &str) -> Result<String, ConfigError> {
    let problem = match text.trim() {
        "" => "is empty",
        key if key.chars().count() < API_KEY_MIN_CHARS => "holds a key shorter than 16 characters",
        key => return Ok(key.to_string()),
    };
    Err(ConfigError::StoredApiKey { path, problem })
}
