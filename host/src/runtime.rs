//! The set of loaded plugins and all their devices: what a framework or the
//! `polychip` command starts from.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::device::Device;
use crate::discovery;
use crate::error::HostError;
use crate::ffi::{LoadOptions, Plugin, load_plugin};
use crate::probe::Probe;

/// A plugin file that did not load, and why.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The file.
    pub path: PathBuf,
    /// The reason, naming the file and the cause.
    pub error: HostError,
}

/// Loaded plugins and their devices. Plugins that fail to load are recorded
/// in [`Runtime::failures`] and the rest keep working.
#[derive(Debug, Default)]
pub struct Runtime {
    plugins: Vec<Arc<Plugin>>,
    devices: Vec<Device>,
    failures: Vec<LoadFailure>,
}

impl Runtime {
    /// Loads every plugin that `POLYCHIP_PLUGIN_PATH` and the bundled
    /// location name (see [`crate::discovery`]).
    pub fn from_env() -> Runtime {
        Runtime::from_env_with(None)
    }

    /// Like [`Runtime::from_env`], but each file is first loaded by `probe`
    /// in a child process: one that crashes or hangs there is recorded as a
    /// failure and never loaded here.
    pub fn from_env_probed(probe: &Probe) -> Runtime {
        Runtime::from_env_with(Some(probe))
    }

    fn from_env_with(probe: Option<&Probe>) -> Runtime {
        let (files, problems) = discovery::discover();
        let mut runtime = match probe {
            Some(probe) => Runtime::load_probed(&files, &LoadOptions::default(), probe),
            None => Runtime::load(&files, &LoadOptions::default()),
        };
        runtime.forgive_hidden_bundled(&discovery::program_dirs());
        runtime
            .failures
            .extend(problems.into_iter().map(|p| LoadFailure {
                error: HostError::Usage(format!(
                    "{}: {}",
                    polychip_files::shown_path(&p.path),
                    p.reason
                )),
                path: p.path,
            }));
        runtime
    }

    /// Loads the given plugin files.
    pub fn load(files: &[impl AsRef<Path>], options: &LoadOptions) -> Runtime {
        let mut runtime = Runtime::default();
        for file in files {
            // A failure is recorded in `failures`; loading goes on with the rest.
            let _ = runtime.add(file.as_ref(), options);
        }
        runtime
    }

    /// Loads the given plugin files, each first in a child process by
    /// `probe`: the files whose probe crashed or ran past its deadline are
    /// recorded as failures, the rest are loaded here.
    pub fn load_probed(
        files: &[impl AsRef<Path>],
        options: &LoadOptions,
        probe: &Probe,
    ) -> Runtime {
        let files: Vec<PathBuf> = files.iter().map(|f| f.as_ref().to_path_buf()).collect();
        let mut runtime = Runtime::default();
        for (file, verdict) in files.iter().zip(probe.check(&files)) {
            match verdict {
                Ok(()) => {
                    // A failure is recorded in `failures`; loading goes on.
                    let _ = runtime.add(file, options);
                }
                Err(error) => {
                    log::info!("{error}");
                    runtime.failures.push(LoadFailure {
                        path: file.clone(),
                        error,
                    });
                }
            }
        }
        runtime
    }

    /// Loads one more plugin file; on failure records it and returns the error.
    pub fn add(&mut self, file: &Path, options: &LoadOptions) -> Result<Arc<Plugin>, HostError> {
        let loaded = load_plugin(file, options).and_then(|plugin| {
            // Another file of the same vendor (a copy, or two plugins that
            // chose one name) would make `vendor:N` ambiguous.
            match self.plugins.iter().find(|p| {
                !Arc::ptr_eq(p, &plugin) && p.vendor().eq_ignore_ascii_case(plugin.vendor())
            }) {
                Some(other) => Err(HostError::VendorTaken {
                    path: file.to_path_buf(),
                    vendor: plugin.vendor().to_string(),
                    other: other.path().to_path_buf(),
                }),
                None => Ok(plugin),
            }
        });
        match loaded {
            Ok(plugin) => {
                if !self.plugins.iter().any(|p| Arc::ptr_eq(p, &plugin)) {
                    log::debug!(
                        "loaded {} {} ({} device(s)) from {}",
                        plugin.vendor(),
                        plugin.version(),
                        plugin.devices().len(),
                        file.display()
                    );
                    for index in 0..plugin.devices().len() as u32 {
                        self.devices.push(Device::new(plugin.clone(), index));
                    }
                    self.plugins.push(plugin.clone());
                }
                Ok(plugin)
            }
            Err(error) => {
                log::info!("{error}");
                self.failures.push(LoadFailure {
                    path: file.to_path_buf(),
                    error: error.clone(),
                });
                Err(error)
            }
        }
    }

    /// Drops the failures of bundled plugins (in `bundled_dirs`) refused
    /// because a plugin of their vendor, listed and so loaded first, was
    /// loaded already: a listed plugin hides the bundled one of its vendor,
    /// as a listed file hides a bundled one of its name, so pointing
    /// `POLYCHIP_PLUGIN_PATH` at another build of a vendor is no failure.
    pub fn forgive_hidden_bundled(&mut self, bundled_dirs: &[PathBuf]) {
        self.failures.retain(|f| match &f.error {
            HostError::VendorTaken { path, .. } if discovery::is_bundled_in(path, bundled_dirs) => {
                log::info!("{} (a listed plugin of its vendor hides it)", f.error);
                false
            }
            _ => true,
        });
    }

    /// Loaded plugins, in load order.
    pub fn plugins(&self) -> &[Arc<Plugin>] {
        &self.plugins
    }

    /// Every device of every loaded plugin.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Plugins that failed to load.
    pub fn failures(&self) -> &[LoadFailure] {
        &self.failures
    }

    /// The devices of the plugin whose vendor is `vendor` (case-insensitive).
    pub fn devices_of(&self, vendor: &str) -> Vec<Device> {
        self.devices
            .iter()
            .filter(|d| d.plugin().vendor().eq_ignore_ascii_case(vendor))
            .cloned()
            .collect()
    }
}
