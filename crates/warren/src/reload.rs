//! Hot reload: how a running server or client takes a new config without a restart.
//!
//! Three triggers — `SIGHUP`, a change of the config file (watched with `notify`,
//! debounced), and the admin API's `POST /api/v1/reload` — end in the same call: read the
//! file again through its [`ConfigSource`] (CLI overrides included), then hand the config
//! to the running side's [`Reloader`]. The side validates it and touches only what changed
//! (see [`crate::server`] and [`crate::client`] for what each side restarts); a file that
//! does not load or validate is refused with every error, and the running config stays.
//! Reloads are applied one at a time, in the order they were asked for.
//!
//! In code, [`Reloader::apply`] takes a config directly, without any file.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::config::ConfigErrors;
use crate::config::typed::Common;
use crate::metrics::Telemetry;

/// Quiet time after the last change of the file before it is read: editors and config
/// management write a file in several steps (truncate, write, rename).
const DEBOUNCE: Duration = Duration::from_millis(300);
/// Reload requests waiting at once; a caller beyond that waits for room.
const QUEUE: usize = 8;

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadSummary {
    /// What was applied, one line each (`added service ssh`, …). Empty: nothing changed.
    pub applied: Vec<String>,
    /// What changed in the config but takes effect only after a restart.
    pub needs_restart: Vec<String>,
}

impl ReloadSummary {
    /// Nothing applied and nothing waiting for a restart.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.needs_restart.is_empty()
    }

    /// Notes the entries of a config table (`what`: "service", "forward service") that were
    /// added, removed or changed.
    pub(crate) fn note_table<V: PartialEq>(
        &mut self,
        what: &str,
        old: &BTreeMap<String, V>,
        new: &BTreeMap<String, V>,
    ) {
        for name in old.keys().filter(|name| !new.contains_key(*name)) {
            self.applied.push(format!("removed {what} {name}"));
        }
        for (name, value) in new {
            match old.get(name) {
                None => self.applied.push(format!("added {what} {name}")),
                Some(before) if before != value => {
                    self.applied.push(format!("changed {what} {name}"));
                }
                Some(_) => {}
            }
        }
    }

    /// Notes the handshake settings both sides share (PSK, transport, ciphers, `insecure`)
    /// that changed.
    pub(crate) fn note_handshake(&mut self, old: &Common<'_>, new: &Common<'_>) {
        self.note_setting("psk", &old.psk, &new.psk, |_| "(secret)".to_owned());
        self.note_setting("transport", &old.transport, &new.transport, |t| {
            t.to_string()
        });
        self.note_setting("transports", &old.transports, &new.transports, |list| {
            let names: Vec<String> = list.iter().map(ToString::to_string).collect();
            format!("[{}]", names.join(","))
        });
        self.note_setting("ciphers", &old.ciphers, &new.ciphers, |c| {
            let names: Vec<String> = c.iter().map(ToString::to_string).collect();
            names.join(",")
        });
        self.note_setting("insecure", &old.insecure, &new.insecure, |b| b.to_string());
    }

    /// Notes a setting that changed, shown with `show` (which must not reveal secrets).
    pub(crate) fn note_setting<T: PartialEq>(
        &mut self,
        key: &str,
        old: &T,
        new: &T,
        show: impl Fn(&T) -> String,
    ) {
        if old != new {
            self.applied
                .push(format!("{key} {} -> {}", show(old), show(new)));
        }
    }
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.applied.is_empty() {
            f.write_str("no changes applied")?;
        } else {
            write!(f, "{}", self.applied.join("; "))?;
        }
        if !self.needs_restart.is_empty() {
            write!(
                f,
                "; not applied until warren restarts: {}",
                self.needs_restart.join("; ")
            )?;
        }
        Ok(())
    }
}

/// Why a reload was not applied. In every case the running config is unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The new file does not load or validate.
    #[error("the new config was refused and the running one kept:\n{0}")]
    Invalid(ConfigErrors),
    /// The config is valid, but applying it failed (e.g. a new service port is taken).
    #[error("the new config was refused and the running one kept: {0}")]
    Unappliable(String),
    /// The side was built in code, with no file to read again.
    #[error(
        "nothing to reload from: this {0} was not started from a config file (start it as `warren {0} FILE`, or apply a config in code with its Reloader)"
    )]
    NoSource(&'static str),
    /// The side has stopped.
    #[error("the {0} has stopped; nothing to reload")]
    Stopped(&'static str),
}

/// The outcome of one reload.
pub type ReloadResult = Result<ReloadSummary, ReloadError>;

/// A config to apply (or why the file did not load), and where the outcome goes.
type Request<C> = (Result<C, ConfigErrors>, oneshot::Sender<ReloadResult>);

/// Hands new configs to a running server or client; cheap to clone.
///
/// Get one with [`crate::BoundServer::reloader`] or [`crate::Client::reloader`].
pub struct Reloader<C> {
    requests: mpsc::Sender<Request<C>>,
    side: &'static str,
}

impl<C> Clone for Reloader<C> {
    fn clone(&self) -> Self {
        Reloader {
            requests: self.requests.clone(),
            side: self.side,
        }
    }
}

impl<C> fmt::Debug for Reloader<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloader")
            .field("side", &self.side)
            .finish()
    }
}

impl<C: Send + 'static> Reloader<C> {
    /// A reloader and the queue its side serves.
    pub(crate) fn new(side: &'static str) -> (Self, Requests<C>) {
        let (requests, queue) = mpsc::channel(QUEUE);
        (Reloader { requests, side }, Requests { queue })
    }

    /// Applies `config` to the running side: it is validated first, then only what
    /// changed is touched. Returns what was done.
    ///
    /// # Errors
    /// [`ReloadError`]: the config was refused (the running one is kept) or the side has
    /// stopped.
    pub async fn apply(&self, config: C) -> ReloadResult {
        self.submit(Ok(config)).await
    }

    /// Queues a loaded config, or the errors of a file that did not load, so that every
    /// outcome is logged and counted in one place ([`Requests::serve`]).
    async fn submit(&self, loaded: Result<C, ConfigErrors>) -> ReloadResult {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send((loaded, reply))
            .await
            .map_err(|_| ReloadError::Stopped(self.side))?;
        answer.await.unwrap_or(Err(ReloadError::Stopped(self.side)))
    }
}

/// The receiving end of a [`Reloader`], served by its side.
pub(crate) struct Requests<C> {
    queue: mpsc::Receiver<Request<C>>,
}

impl<C: Send + 'static> Requests<C> {
    /// Serves the requests on the side's `tasks` until `cancel` (applied with `apply`,
    /// counted in `telemetry`) and, when the side runs from a config source, the source's
    /// triggers. Returns what the admin API calls to reload from the source.
    pub(crate) fn start<F, Fut>(
        self,
        reloader: Reloader<C>,
        source: Option<ConfigSource<C>>,
        (tasks, cancel, telemetry): (&TaskTracker, &CancellationToken, &Arc<Telemetry>),
        apply: F,
    ) -> Option<Arc<dyn Reload>>
    where
        F: FnMut(C) -> Fut + Send + 'static,
        Fut: Future<Output = ReloadResult> + Send + 'static,
    {
        tasks.spawn(self.serve(cancel.clone(), Arc::clone(telemetry), apply));
        let source = source?;
        // Listening starts now, before the side serves anyone: a SIGHUP or a file change
        // from then on is seen, and the descriptors it takes are there from the start.
        let triggers = Triggers::new(&source);
        let in_force = Mutex::new(std::fs::read_to_string(&source.path).ok());
        let from_source = Arc::new(FromSource {
            source,
            reloader,
            in_force,
        });
        tasks.spawn(watch_triggers(
            Arc::clone(&from_source) as Arc<dyn Reload>,
            triggers,
            cancel.clone(),
        ));
        Some(from_source)
    }
}

impl<C> Requests<C> {
    /// Applies the requests one at a time with `apply` until `cancel` fires, logging each
    /// outcome.
    pub(crate) async fn serve<F, Fut>(
        mut self,
        cancel: CancellationToken,
        telemetry: Arc<Telemetry>,
        mut apply: F,
    ) where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = ReloadResult>,
    {
        loop {
            let request = tokio::select! {
                () = cancel.cancelled() => return,
                request = self.queue.recv() => request,
            };
            let Some((loaded, reply)) = request else {
                return;
            };
            let outcome = match loaded {
                Ok(config) => apply(config).await,
                Err(errors) => Err(ReloadError::Invalid(errors)),
            };
            telemetry.metrics.config_reloaded(outcome.is_ok());
            match &outcome {
                Ok(summary) => info!(
                    event = "config_reloaded",
                    applied = %summary.applied.join("; "),
                    needs_restart = %summary.needs_restart.join("; "),
                    "config reloaded: {summary}"
                ),
                Err(error) => error!(event = "reload_rejected", %error, "config reload refused"),
            }
            let _ = reply.send(outcome);
        }
    }
}

/// The entries of `wanted` that differ from the running ones, each with the socket it is
/// to serve on: the running entry's socket when `same_place` says the address and protocol
/// stayed, else a new one from `bind`. Everything is bound before anything changes, so a
/// port that cannot be had refuses the reload as a whole.
pub(crate) async fn sockets_for<'a, V, S, E, Fut>(
    wanted: impl IntoIterator<Item = &'a V>,
    running: impl Fn(&V) -> Option<(V, S)>,
    same_place: impl Fn(&V, &V) -> bool,
    bind: impl Fn(&'a V) -> Fut,
) -> Result<Vec<(V, S)>, ReloadError>
where
    V: PartialEq + Clone + 'a,
    Fut: Future<Output = Result<S, E>>,
    E: fmt::Display,
{
    let mut fresh = Vec::new();
    for entry in wanted {
        let before = running(entry);
        if before
            .as_ref()
            .is_some_and(|(settings, _)| settings == entry)
        {
            continue;
        }
        let socket = match before {
            Some((settings, socket)) if same_place(&settings, entry) => socket,
            _ => bind(entry)
                .await
                .map_err(|error| ReloadError::Unappliable(error.to_string()))?,
        };
        fresh.push((entry.clone(), socket));
    }
    Ok(fresh)
}

/// Loads a config file into a side's config.
type Load<C> = dyn Fn(&Path) -> Result<C, ConfigErrors> + Send + Sync;

/// Where a running side's config comes from, so it can be read again: a file, and how to
/// turn it into the side's config (the CLI re-applies its flag overrides here).
pub struct ConfigSource<C> {
    path: PathBuf,
    load: Arc<Load<C>>,
    watch_file: bool,
}

impl<C> fmt::Debug for ConfigSource<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigSource")
            .field("path", &self.path)
            .field("watch_file", &self.watch_file)
            .finish_non_exhaustive()
    }
}

impl<C> ConfigSource<C> {
    /// The file at `path`, read with `load`. Watched for changes unless
    /// [`ConfigSource::watch_file`] says otherwise; `SIGHUP` and the admin API reload it
    /// either way.
    pub fn new(
        path: impl Into<PathBuf>,
        load: impl Fn(&Path) -> Result<C, ConfigErrors> + Send + Sync + 'static,
    ) -> Self {
        ConfigSource {
            path: path.into(),
            load: Arc::new(load),
            watch_file: true,
        }
    }

    /// Whether a change of the file reloads it (default: yes).
    pub fn watch_file(mut self, watch: bool) -> Self {
        self.watch_file = watch;
        self
    }
}

/// Reads a side's config source again and applies it: what `SIGHUP`, the file watcher and
/// `POST /api/v1/reload` call.
pub trait Reload: Send + Sync {
    /// Reloads once.
    fn reload(&self) -> Pin<Box<dyn Future<Output = ReloadResult> + Send + '_>>;

    /// The config file and the text of it in force (read when the side started, then at
    /// each reload that was applied).
    fn in_force(&self) -> (PathBuf, Option<String>);
}

/// A [`ConfigSource`] joined to the [`Reloader`] of the side it configures.
struct FromSource<C> {
    source: ConfigSource<C>,
    reloader: Reloader<C>,
    /// The text of the file as last applied (`None`: it could not be read).
    in_force: Mutex<Option<String>>,
}

impl<C: Send + 'static> Reload for FromSource<C> {
    fn reload(&self) -> Pin<Box<dyn Future<Output = ReloadResult> + Send + '_>> {
        Box::pin(async move {
            // The text is read next to the load so the dashboard shows what was applied
            // (an edit between the two reads is rare and shows at the next reload).
            let text = std::fs::read_to_string(&self.source.path).ok();
            let loaded = (self.source.load)(&self.source.path);
            let outcome = self.reloader.submit(loaded).await;
            if outcome.is_ok() {
                *self.in_force.lock().unwrap_or_else(PoisonError::into_inner) = text;
            }
            outcome
        })
    }

    fn in_force(&self) -> (PathBuf, Option<String>) {
        let text = self
            .in_force
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (self.source.path.clone(), text)
    }
}

/// What starts a reload from a config source: `SIGHUP`, and changes of the file when it is
/// watched.
struct Triggers {
    file: Option<FileWatch>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Triggers {
    /// Starts listening (inside the runtime).
    fn new<C>(source: &ConfigSource<C>) -> Triggers {
        let file = if source.watch_file {
            FileWatch::start(&source.path)
        } else {
            None
        };
        #[cfg(unix)]
        let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(error) => {
                warn!(event = "reload_signal_failed", %error, "cannot listen for SIGHUP; reload through the file or the admin API");
                None
            }
        };
        Triggers {
            file,
            #[cfg(unix)]
            hangup,
        }
    }

    /// Waits for the next trigger; names it.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        let hup = async {
            let received = match self.hangup.as_mut() {
                Some(signal) => signal.recv().await,
                None => None,
            };
            // A closed signal stream never fires again.
            if received.is_none() {
                std::future::pending::<()>().await;
            }
        };
        #[cfg(not(unix))]
        let hup = std::future::pending::<()>();
        let changed = async {
            match self.file.as_mut() {
                Some(watch) => watch.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = hup => "SIGHUP",
            () = changed => "file change",
        }
    }
}

/// Reloads on every trigger until `cancel` fires.
async fn watch_triggers(
    reload: Arc<dyn Reload>,
    mut triggers: Triggers,
    cancel: CancellationToken,
) {
    loop {
        let trigger = tokio::select! {
            () = cancel.cancelled() => return,
            trigger = triggers.next() => trigger,
        };
        info!(event = "reload_requested", trigger, "reloading the config");
        // The outcome is logged where it is decided.
        let _ = reload.reload().await;
    }
}

/// A watch on one config file (through its directory, so that editors that replace the
/// file by renaming a new one over it are seen too).
struct FileWatch {
    // Held for its drop: the watch ends with it.
    _watcher: notify::RecommendedWatcher,
    events: mpsc::Receiver<()>,
}

impl FileWatch {
    fn start(path: &Path) -> Option<FileWatch> {
        use notify::Watcher;
        let Some(name) = path.file_name().map(std::ffi::OsStr::to_owned) else {
            warn!(event = "reload_watch_failed", path = %path.display(), "the config path names no file; reload with SIGHUP or the admin API");
            return None;
        };
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        // One pending notice is enough: the debounce reads the file once anyway.
        let (notify_tx, events) = mpsc::channel(1);
        let handler = move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if event.kind.is_access() {
                return;
            }
            if event
                .paths
                .iter()
                .any(|p| p.file_name() == Some(name.as_os_str()))
            {
                let _ = notify_tx.try_send(());
            }
        };
        let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
            watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
            Ok(watcher)
        });
        match watcher {
            Ok(watcher) => {
                debug!(event = "reload_watching", path = %path.display(), "watching the config file for changes");
                Some(FileWatch {
                    _watcher: watcher,
                    events,
                })
            }
            Err(error) => {
                warn!(event = "reload_watch_failed", path = %path.display(), %error, "cannot watch the config file; reload with SIGHUP or the admin API");
                None
            }
        }
    }

    /// Waits for a change, then for [`DEBOUNCE`] of quiet.
    async fn changed(&mut self) {
        if self.events.recv().await.is_none() {
            return std::future::pending().await;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(DEBOUNCE) => return,
                more = self.events.recv() => if more.is_none() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_are_applied_in_order_and_answered() {
        let (reloader, requests) = Reloader::<u32>::new("server");
        let cancel = CancellationToken::new();
        let telemetry = Telemetry::new(crate::Side::Server);
        let serving = tokio::spawn(requests.serve(cancel.clone(), telemetry, |n| async move {
            if n == 0 {
                Err(ReloadError::Unappliable("zero".into()))
            } else {
                Ok(ReloadSummary {
                    applied: vec![format!("applied {n}")],
                    needs_restart: Vec::new(),
                })
            }
        }));
        let first = reloader.apply(1).await.unwrap();
        assert_eq!(first.applied, ["applied 1"]);
        let refused = reloader.apply(0).await.unwrap_err();
        assert!(
            refused.to_string().contains("running one kept"),
            "{refused}"
        );
        cancel.cancel();
        serving.await.unwrap();
        assert!(matches!(
            reloader.apply(2).await,
            Err(ReloadError::Stopped("server"))
        ));
    }

    #[test]
    fn summary_reads_as_one_line() {
        let empty = ReloadSummary::default();
        assert!(empty.is_empty());
        assert_eq!(empty.to_string(), "no changes applied");
        let summary = ReloadSummary {
            applied: vec!["added service a".into(), "removed service b".into()],
            needs_restart: vec!["bind".into()],
        };
        assert_eq!(
            summary.to_string(),
            "added service a; removed service b; not applied until warren restarts: bind"
        );
    }

    #[tokio::test]
    async fn a_changed_file_is_seen_once_after_the_debounce() {
        let dir = std::env::temp_dir().join(format!("warren-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("watched.toml");
        std::fs::write(&path, "a").unwrap();
        let mut watch = FileWatch::start(&path).expect("inotify works here");
        // Several writes in a burst, and a sibling file that must not count.
        for i in 0..5 {
            std::fs::write(&path, format!("b{i}")).unwrap();
        }
        std::fs::write(dir.join("other.toml"), "x").unwrap();
        tokio::time::timeout(Duration::from_secs(5), watch.changed())
            .await
            .expect("a change is reported");
        // The burst was folded into one notice: nothing more is pending.
        let again = tokio::time::timeout(Duration::from_millis(500), watch.changed()).await;
        assert!(again.is_err(), "one burst, one reload");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
