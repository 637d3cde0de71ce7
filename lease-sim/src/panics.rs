//! Every panic of a run is recorded, wherever it happens (a process's task, a model, the
//! simulation itself), and fails the run: tokio catches a task's panic, so without the hook a
//! panic in library code could go unseen.

use std::cell::RefCell;
use std::sync::Once;

thread_local! {
    /// The panics of the run on this thread.
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Installs the hook (once per process): it records each panic for the thread's run instead of
/// printing it, unless `LEASE_SIM_PRINT_PANICS` is set.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let print = std::env::var_os("LEASE_SIM_PRINT_PANICS").is_some();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = match info.payload().downcast_ref::<&str>() {
                Some(text) => (*text).to_owned(),
                None => (info.payload().downcast_ref::<String>())
                    .cloned()
                    .unwrap_or_else(|| "(no message)".into()),
            };
            let at = info
                .location()
                .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
            PANICS.with(|panics| panics.borrow_mut().push(format!("{message}{at}")));
            if print {
                previous(info);
            }
        }));
    });
}

/// The panics recorded on this thread since the last call.
pub fn take() -> Vec<String> {
    PANICS.with(|panics| std::mem::take(&mut *panics.borrow_mut()))
}
