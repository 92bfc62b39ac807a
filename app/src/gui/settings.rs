//! The app's non-secret settings, persisted as JSON in the data folder.
//! Secrets never go here: the wallet lives in its own encrypted keystore.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Network {
    /// The embedded chain with a demo job and in-process peers.
    Sandbox,
    Devnet,
    MainnetBeta,
    Custom,
}

impl Network {
    pub const ALL: [Network; 4] = [
        Network::Sandbox,
        Network::Devnet,
        Network::MainnetBeta,
        Network::Custom,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Network::Sandbox => "Sandbox",
            Network::Devnet => "Devnet",
            Network::MainnetBeta => "Mainnet-beta",
            Network::Custom => "Custom RPC",
        }
    }

    /// The public RPC endpoint; `None` for Sandbox and Custom.
    pub fn url(self) -> Option<&'static str> {
        match self {
            Network::Devnet => Some("https://api.devnet.solana.com"),
            Network::MainnetBeta => Some("https://api.mainnet-beta.solana.com"),
            _ => None,
        }
    }
}

/// Which device trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Gpu {
    Auto,
    Cuda,
    Wgpu,
    Cpu,
}

impl Gpu {
    pub const ALL: [Gpu; 4] = [Gpu::Auto, Gpu::Cuda, Gpu::Wgpu, Gpu::Cpu];

    pub fn label(self) -> &'static str {
        match self {
            Gpu::Auto => "Automatic (CUDA, then wgpu, then CPU)",
            Gpu::Cuda => "CUDA",
            Gpu::Wgpu => "wgpu (Vulkan / Metal / DX12)",
            Gpu::Cpu => "CPU only",
        }
    }

    pub fn choice(self) -> cohort_engine::backend::BackendChoice {
        use cohort_engine::backend::BackendChoice as C;
        match self {
            Gpu::Auto => C::Auto,
            Gpu::Cuda => C::Cuda,
            Gpu::Wgpu => C::Wgpu,
            Gpu::Cpu => C::Cpu,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub network: Network,
    pub custom_url: String,
    pub program_id: String,
    pub data_dir: PathBuf,
    pub gpu: Gpu,
    /// Jobs estimated to need more memory than this are shown as not
    /// qualifying; 0 means no cap.
    pub memory_cap_mib: u32,
    /// When to train: idle time, games, battery, schedule, heat.
    pub when: crate::when::Rules,
    /// Open (minimised) when the user logs in: a login item, see `autostart`.
    pub start_with_computer: bool,
    /// While paused, hand the GPU memory the training backend pools between
    /// steps back to the driver (a game gets it; resuming allocates again).
    pub release_gpu_memory_when_paused: bool,
    /// Argon2id cost for new keystores: not saved, always the full cost
    /// unless a test lowers it.
    #[serde(skip)]
    pub kdf: crate::wallet::keystore::Kdf,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            network: Network::Sandbox,
            custom_url: "http://127.0.0.1:8899".into(),
            program_id: cohort_program::ID.to_string(),
            data_dir: crate::chain::keys::home(),
            gpu: Gpu::Auto,
            memory_cap_mib: 0,
            when: crate::when::Rules::default(),
            start_with_computer: false,
            release_gpu_memory_when_paused: false,
            kdf: Default::default(),
        }
    }
}

impl Settings {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("settings.json")
    }

    /// The saved settings, or the defaults when there are none. A damaged
    /// file is reported and replaced by defaults rather than blocking start.
    pub fn load(data_dir: &Path) -> (Self, Option<String>) {
        let p = Self::path(data_dir);
        let fresh = Self {
            data_dir: data_dir.to_path_buf(),
            ..Self::default()
        };
        let Ok(text) = std::fs::read_to_string(&p) else {
            return (fresh, None);
        };
        match serde_json::from_str(&text) {
            Ok(s) => (s, None),
            Err(e) => (
                fresh,
                Some(format!("{} is damaged ({e}); using defaults", p.display())),
            ),
        }
    }

    /// Writes atomically into the data folder the settings name.
    pub fn save(&self) -> Result<()> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("creating {}", self.data_dir.display()))?;
        let p = Self::path(&self.data_dir);
        let tmp = crate::chain::keys::stage(&p, &serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))
    }

    pub fn keystore(&self) -> PathBuf {
        self.data_dir.join("wallet.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_a_damaged_file_falls_back_to_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let (s, warn) = Settings::load(dir.path());
        assert_eq!(s.network, Network::Sandbox);
        assert!(warn.is_none());
        let mut s2 = s.clone();
        s2.network = Network::Devnet;
        s2.memory_cap_mib = 4096;
        s2.save().unwrap();
        assert_eq!(Settings::load(dir.path()).0, s2);
        std::fs::write(Settings::path(dir.path()), "{ not json").unwrap();
        let (s3, warn) = Settings::load(dir.path());
        assert_eq!(s3.network, Network::Sandbox);
        assert!(warn.unwrap().contains("damaged"));
    }
}
