//! Console work that holds a database connection for long (audit exports,
//! period syncs) runs a few at a time. More would take the connections the
//! console's pages need (the proxy has its own), and queueing helps nobody:
//! one more is refused at once with "busy, try again".

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Audit exports streaming at once, per process.
pub const EXPORTS_AT_ONCE: usize = 2;
/// Period syncs running at once from the console, per process.
pub const SYNCS_AT_ONCE: usize = 2;

#[derive(Clone)]
pub struct HeavyWork {
    exports: Arc<Semaphore>,
    syncs: Arc<Semaphore>,
}

/// No slot was free: what to tell the person.
#[derive(Debug)]
pub struct Busy(pub String);

impl HeavyWork {
    pub fn new() -> Self {
        Self {
            exports: Arc::new(Semaphore::new(EXPORTS_AT_ONCE)),
            syncs: Arc::new(Semaphore::new(SYNCS_AT_ONCE)),
        }
    }

    /// A slot for one audit export, held until the export ends.
    pub fn export(&self) -> Result<OwnedSemaphorePermit, Busy> {
        self.exports.clone().try_acquire_owned().map_err(|_| {
            Busy(format!(
                "{EXPORTS_AT_ONCE} audit exports are already running; try again when one has finished"
            ))
        })
    }

    /// A slot for one period sync, held until the sync ends.
    pub fn sync(&self) -> Result<OwnedSemaphorePermit, Busy> {
        self.syncs.clone().try_acquire_owned().map_err(|_| {
            Busy(format!(
                "{SYNCS_AT_ONCE} syncs are already running; try again when one has finished"
            ))
        })
    }
}

impl Default for HeavyWork {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_export_more_than_allowed_is_refused_until_one_ends() {
        let heavy = HeavyWork::new();
        let running: Vec<_> = (0..EXPORTS_AT_ONCE)
            .map(|_| heavy.export().unwrap())
            .collect();
        let refused = heavy.export().unwrap_err();
        assert!(refused.0.contains("try again"), "{}", refused.0);
        assert!(heavy.sync().is_ok(), "syncs have slots of their own");
        drop(running);
        assert!(heavy.export().is_ok());
    }
}
