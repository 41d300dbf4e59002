//! Spillway started in-process: listeners on port 0, threads unpinned.

use std::path::PathBuf;

pub use spillway::ServerHandle;
use spillway::{Config, ConfigSource, Overrides};

/// The head every test config starts with: port 0 listeners, `cores`, unpinned threads.
pub fn test_head(cores: usize) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ncores = {cores}\npin_cores = false\n"
    )
}

/// Starts Spillway from a TOML snippet appended to [`test_head`].
pub fn proxy(cores: usize, toml: &str) -> ServerHandle {
    proxy_with(cores, toml, Overrides::default())
}

/// [`proxy`] with command-line overrides.
pub fn proxy_with(cores: usize, toml: &str, overrides: Overrides) -> ServerHandle {
    let text = format!("{}{toml}", test_head(cores));
    let config = Config::parse(&text, &overrides).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let source = ConfigSource {
        path: None,
        overrides,
    };
    spillway::start(config, source).expect("proxy starts")
}

/// Starts Spillway from a config file, so `/reload` can read it again.
pub fn proxy_file(file: &ConfigFile) -> ServerHandle {
    let overrides = Overrides::default();
    let config = Config::load(&file.path, &overrides).unwrap_or_else(|e| panic!("{e}"));
    let source = ConfigSource {
        path: Some(file.path.clone()),
        overrides,
    };
    spillway::start(config, source).expect("proxy starts")
}

/// A `[[models]]` block: `extra` lines, then one worker per URL, named by [`worker_name`].
pub fn model(name: &str, extra: &str, urls: &[String]) -> String {
    let mut s = format!("[[models]]\nname = \"{name}\"\n{extra}\n");
    for u in urls {
        s.push_str(&format!(
            "[[models.workers]]\nurl = \"{u}\"\nname = \"{}\"\n",
            worker_name(u)
        ));
    }
    s
}

/// The name [`model`] gives the worker at `url`: `w<port>`.
pub fn worker_name(url: &str) -> String {
    format!("w{}", url.rsplit(':').next().unwrap_or("0"))
}

/// A config file `spillway.toml` in a fresh temp directory, removed on drop.
pub struct ConfigFile {
    pub path: PathBuf,
    dir: PathBuf,
}

impl ConfigFile {
    /// Writes `text` to a new file.
    pub fn new(text: &str) -> ConfigFile {
        let dir = crate::tools::scratch_dir("test");
        let path = dir.join("spillway.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { path, dir }
    }

    /// Replaces the file's text.
    pub fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
