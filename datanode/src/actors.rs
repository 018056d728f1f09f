//! The DataNode's actix actor system, on its own thread.
//!
//! `Actor::start()` needs an actix runtime on the current thread, which tokio tasks do not
//! have. So `DataNode::start` runs an actix `System` on a dedicated std thread; actors are
//! started there with `Actor::start_in_arbiter` and reached from tokio tasks through their
//! `Addr` (which is `Send`). Nothing blocks that thread: the actors' disk I/O runs on the
//! tokio blocking pool.

use crate::error::{DatanodeError, Result};
use actix::{ArbiterHandle, System};

/// A running actor system.
#[derive(Debug)]
pub(crate) struct ActorSystem {
    system: System,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ActorSystem {
    /// Starts the system on a thread named `name`.
    pub fn start(name: &str) -> Result<ActorSystem> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let runner = actix::System::new();
                let _ = tx.send(System::current());
                if let Err(e) = runner.run() {
                    tracing::error!("actor system ended with an error: {e}");
                }
            })
            .map_err(|e| DatanodeError::io("spawn thread", name, e))?;
        let system = rx.recv().map_err(|_| DatanodeError::ActorGone {
            actor: "actor system thread",
        })?;
        Ok(ActorSystem {
            system,
            thread: Some(thread),
        })
    }

    /// Where to start actors.
    pub fn arbiter(&self) -> ArbiterHandle {
        self.system.arbiter().clone()
    }

    /// Asks the system to stop (its actors are dropped).
    pub fn stop(&self) {
        self.system.stop();
    }

    /// Stops the system and waits for its thread (on the blocking pool).
    pub async fn stop_and_join(mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}
