//! A tracing layer that records what the library logs and how its spans relate, for tests that
//! assert on them: every span's name, parent and follows-from links, and every event's level,
//! target, text and enclosing spans.
//!
//! Spans get a serial number of their own (the registry reuses span ids once a span closes), so a
//! record stays meaningful after its span ended. [`Capture::scoped`] captures on the current
//! thread only (a `current_thread` runtime's tasks included); events a library logs on threads of
//! its own (lapin's I/O loop) need [`Capture::layer`] in a global subscriber, in a test binary of
//! its own.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as it was created.
#[derive(Clone, Debug)]
pub struct SpanRecord {
    /// This capture's number for the span.
    pub serial: u64,
    /// The span's name (`lease.hold`, …).
    pub name: &'static str,
    /// The parent's serial: explicit, or the span current where it was created.
    pub parent: Option<u64>,
    /// The serials of the spans it follows from.
    pub follows_from: Vec<u64>,
}

/// One event as it was logged.
#[derive(Clone, Debug)]
pub struct EventRecord {
    /// Its level.
    pub level: Level,
    /// Its target (module path unless given).
    pub target: String,
    /// Its message and fields, `message field=value …`.
    pub text: String,
    /// The serials of the spans it was logged in, innermost first.
    pub scope: Vec<u64>,
}

#[derive(Debug, Default)]
struct Records {
    spans: Vec<SpanRecord>,
    events: Vec<EventRecord>,
}

/// What has been captured so far; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Capture {
    records: Arc<Mutex<Records>>,
}

/// The span's serial, kept in the registry's extensions of the span.
struct Serial(u64);

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

impl Capture {
    /// Captures on this thread until the guard is dropped, at every level.
    pub fn scoped() -> (Capture, tracing::subscriber::DefaultGuard) {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.layer());
        let guard = tracing::subscriber::set_default(subscriber);
        (capture, guard)
    }

    /// The layer that records into this capture.
    pub fn layer(&self) -> CaptureLayer {
        CaptureLayer {
            capture: self.clone(),
        }
    }

    fn records(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every span created so far.
    pub fn spans(&self) -> Vec<SpanRecord> {
        self.records().spans.clone()
    }

    /// Every event logged so far.
    pub fn events(&self) -> Vec<EventRecord> {
        self.records().events.clone()
    }

    /// The spans named `name`, in creation order.
    pub fn spans_named(&self, name: &str) -> Vec<SpanRecord> {
        self.records()
            .spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    /// The span with serial `serial`.
    pub fn span(&self, serial: u64) -> Option<SpanRecord> {
        self.records()
            .spans
            .iter()
            .find(|s| s.serial == serial)
            .cloned()
    }

    /// The events whose text contains `needle`.
    pub fn events_containing(&self, needle: &str) -> Vec<EventRecord> {
        self.records()
            .events
            .iter()
            .filter(|e| e.text.contains(needle))
            .cloned()
            .collect()
    }

    /// Forgets everything captured so far.
    pub fn clear(&self) {
        let mut records = self.records();
        records.spans.clear();
        records.events.clear();
    }
}

/// The [`Layer`] of a [`Capture`].
#[derive(Debug)]
pub struct CaptureLayer {
    capture: Capture,
}

fn serial_of<S>(ctx: &Context<'_, S>, id: &Id) -> Option<u64>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let span = ctx.span(id)?;
    let extensions = span.extensions();
    extensions.get::<Serial>().map(|s| s.0)
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // Several capture layers in one subscriber share the span's serial.
        let serial = match serial_of(&ctx, id) {
            Some(serial) => serial,
            None => {
                let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
                if let Some(span) = ctx.span(id) {
                    span.extensions_mut().insert(Serial(serial));
                }
                serial
            }
        };
        let parent = if let Some(parent) = attrs.parent() {
            serial_of(&ctx, parent)
        } else if attrs.is_contextual() {
            ctx.current_span()
                .id()
                .and_then(|current| serial_of(&ctx, current))
        } else {
            None
        };
        self.capture.records().spans.push(SpanRecord {
            serial,
            name: attrs.metadata().name(),
            parent,
            follows_from: Vec::new(),
        });
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        let (Some(span), Some(follows)) = (serial_of(&ctx, span), serial_of(&ctx, follows)) else {
            return;
        };
        let mut records = self.capture.records();
        if let Some(record) = records.spans.iter_mut().find(|s| s.serial == span) {
            record.follows_from.push(follows);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut text = Text::default();
        event.record(&mut text);
        let scope = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .filter_map(|span| span.extensions().get::<Serial>().map(|s| s.0))
                    .collect()
            })
            .unwrap_or_default();
        self.capture.records().events.push(EventRecord {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            text: text.0,
            scope,
        });
    }
}

/// An event's message and fields as text.
#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }
}
