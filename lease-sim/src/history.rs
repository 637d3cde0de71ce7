//! Histories of lease holders, and the verdicts judged from them: the format the process tests'
//! workers append to (`lease_tests::history`, which writes it) and this crate's simulated
//! processes write, so one set of verdicts judges both.
//!
//! One line per event:
//!
//! ```text
//! <ns> <pid> <event> <sequencer-text> [detail…]
//! ```
//!
//! Events: `acquired`, `write` (one unit of guarded work), `lost <reason…>` (the lease was lost and
//! the work dropped), `released ok` / `released err <error>` (what `Lease::release` answered),
//! `waiting` (an acquire began), `exit` (the process is about to leave `main`) and `panic <message>
//! at <location> (thread <name>)`. The sequencer is `-` where there is none. Times are nanoseconds:
//! wall-clock since the epoch for the process tests (so the files of every process on one machine
//! merge into one timeline), simulated since the run began for the simulation.
//!
//! A `write` line marks an instant at which the work really ran. The verdicts only use `write`
//! lines:
//!
//! - [`History::max_concurrent_writers`]: each sequencer's writes, first to last, form an
//!   interval; the most intervals open at one instant.
//! - [`History::stale_writes`]: a write by `S` after another sequencer of the same slot began to
//!   write (S's first write < S'.first < t).
//! - [`History::stale_writes_shared`]: the same for the `limit` shared slots of a Consul
//!   semaphore, whose holders have no slot number.
//! - [`History::handoff_gaps`]: from one sequencer's last write to the next one's first.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use lease_core::{BackendKind, Sequencer};

/// What a history line records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An acquire began (`waiting`).
    Waiting,
    /// The lease was acquired.
    Acquired,
    /// One unit of guarded work ran.
    Write,
    /// The lease was lost; the detail says why.
    Lost,
    /// `Lease::release` answered; the detail is `ok` or `err <error>`.
    Released,
    /// The process is about to return from `main`.
    Exit,
    /// The process panicked (on any thread); the detail is the message and where.
    Panic,
    /// Anything else a worker logged (e.g. `error`).
    Other(String),
}

impl Kind {
    fn parse(word: &str) -> Kind {
        match word {
            "waiting" => Kind::Waiting,
            "acquired" => Kind::Acquired,
            "write" => Kind::Write,
            "lost" => Kind::Lost,
            "released" => Kind::Released,
            "exit" => Kind::Exit,
            "panic" => Kind::Panic,
            other => Kind::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Waiting => "waiting",
            Kind::Acquired => "acquired",
            Kind::Write => "write",
            Kind::Lost => "lost",
            Kind::Released => "released",
            Kind::Exit => "exit",
            Kind::Panic => "panic",
            Kind::Other(word) => word,
        })
    }
}

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// Wall-clock nanoseconds since the epoch.
    pub t: u128,
    /// The worker's process id.
    pub pid: u32,
    /// The event.
    pub kind: Kind,
    /// The sequencer's text, or `-`.
    pub seq: String,
    /// The rest of the line (a loss reason, `ok`, `err …`).
    pub detail: String,
}

impl Line {
    /// Parses one line; `None` for a malformed one.
    pub fn parse(text: &str) -> Option<Line> {
        let mut parts = text.splitn(5, ' ');
        let t = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        let kind = Kind::parse(parts.next()?);
        let seq = parts.next().unwrap_or("-").to_owned();
        let detail = parts.next().unwrap_or("").to_owned();
        Some(Line {
            t,
            pid,
            kind,
            seq,
            detail,
        })
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {} {}", self.t, self.pid, self.kind, self.seq)?;
        if !self.detail.is_empty() {
            write!(f, " {}", self.detail)?;
        }
        Ok(())
    }
}

/// One sequencer's writes: from its first to its last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The sequencer's text.
    pub seq: String,
    /// The process that held it.
    pub pid: u32,
    /// Its first write (ns).
    pub first: u128,
    /// Its last write (ns).
    pub last: u128,
    /// How many writes.
    pub writes: usize,
}

/// The worst overlap of writers found by [`History::max_concurrent_writers`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// How many sequencers' write intervals were open at once (0 if nobody wrote).
    pub count: usize,
    /// The limit it was judged against.
    pub limit: usize,
    /// The instant (ns) the worst overlap began.
    pub at: u128,
    /// The sequencers open at that instant.
    pub spans: Vec<Span>,
}

impl Overlap {
    /// Whether more writers than `limit` were open at once.
    pub fn exceeds_limit(&self) -> bool {
        self.count > self.limit
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} concurrent writers (limit {}) at {}:",
            self.count, self.limit, self.at
        )?;
        for s in &self.spans {
            write!(
                f,
                "\n  pid {} {} wrote {} times from {} to {} ({:.3} ms)",
                s.pid,
                s.seq,
                s.writes,
                s.first,
                s.last,
                ms(s.last as i128 - s.first as i128)
            )?;
        }
        Ok(())
    }
}

/// A write made after its sequencer had been superseded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The superseded sequencer.
    pub seq: String,
    /// Its process.
    pub pid: u32,
    /// When it wrote (ns).
    pub t: u128,
    /// The sequencer whose first write superseded it (for a shared semaphore: the last of the
    /// `limit` newer writers that filled every slot).
    pub newer_seq: String,
    /// That sequencer's process.
    pub newer_pid: u32,
    /// When `S` was superseded (ns): the newer holder's first write.
    pub superseded_at: u128,
}

impl StaleWrite {
    /// How long after the newer holder began this write happened, in ms.
    pub fn after_ms(&self) -> f64 {
        ms(self.t as i128 - self.superseded_at as i128)
    }
}

impl fmt::Display for StaleWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} wrote under {} at {}, {:.3} ms after pid {} began writing under {}",
            self.pid,
            self.seq,
            self.t,
            self.after_ms(),
            self.newer_pid,
            self.newer_seq
        )
    }
}

/// The gap between one holder's last write and the next holder's first.
#[derive(Clone, Debug, PartialEq)]
pub struct Handoff {
    /// The earlier sequencer.
    pub from: String,
    /// The later sequencer.
    pub to: String,
    /// next.first − prev.last, in ms (negative if they overlapped).
    pub gap_ms: f64,
}

fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// The merged lines of many histories, in time order.
#[derive(Clone, Debug, Default)]
pub struct History {
    lines: Vec<Line>,
}

impl History {
    /// A history of these lines (sorted by time, stably).
    pub fn from_lines(mut lines: Vec<Line>) -> History {
        lines.sort_by_key(|l| l.t);
        History { lines }
    }

    /// Parses history text; malformed lines are an error naming them.
    pub fn parse(text: &str) -> Result<History, String> {
        let mut lines = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            lines.push(
                Line::parse(raw).ok_or_else(|| format!("line {}: malformed: {raw:?}", n + 1))?,
            );
        }
        Ok(History::from_lines(lines))
    }

    /// Reads and merges the history files at `paths` (a missing file is empty). Panics on a
    /// malformed line, naming the file.
    ///
    /// A file read while its process appends may end in part of a line (a reader can see a
    /// `write` half copied): that unterminated tail is left for the next read.
    pub fn load<P: AsRef<Path>>(paths: &[P]) -> History {
        let mut lines = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let mut text = std::fs::read_to_string(path).unwrap_or_default();
            text.truncate(text.rfind('\n').map_or(0, |end| end + 1));
            match History::parse(&text) {
                Ok(h) => lines.extend(h.lines),
                Err(e) => panic!("{}: {e}", path.display()),
            }
        }
        History::from_lines(lines)
    }

    /// Every `*.history` file under `dir`, merged.
    pub fn load_dir(dir: &Path) -> History {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "history"))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        History::load(&paths)
    }

    /// The lines, in time order.
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// The lines of process `pid`.
    pub fn of_pid(&self, pid: u32) -> impl Iterator<Item = &Line> {
        self.lines.iter().filter(move |l| l.pid == pid)
    }

    /// The lines about sequencer `seq`.
    pub fn of_seq<'a>(&'a self, seq: &'a str) -> impl Iterator<Item = &'a Line> {
        self.lines.iter().filter(move |l| l.seq == seq)
    }

    /// The first line of `kind` by `pid`, if any.
    pub fn first(&self, pid: u32, kind: &Kind) -> Option<&Line> {
        self.of_pid(pid).find(|l| &l.kind == kind)
    }

    /// Splits off the one write per pause that no library can prevent.
    ///
    /// `resumes` are `(pid, SIGCONT instant)`. A process stopped between its `is_held()` check
    /// and its write makes that one write after SIGCONT, whatever the library does; the first
    /// write of each pid at or after its SIGCONT is taken out. Returns the history without those
    /// writes, to judge, and the writes taken out, to count apart. A holder that did not
    /// self-fence writes again a few milliseconds later, and that second write stays in.
    pub fn without_resumed_writes(&self, resumes: &[(u32, u128)]) -> (History, Vec<Line>) {
        let mut exempt: Vec<Line> = Vec::new();
        for &(pid, cont) in resumes {
            if let Some(first) = self
                .of_pid(pid)
                .find(|l| l.kind == Kind::Write && l.t >= cont)
            {
                exempt.push(first.clone());
            }
        }
        let judged = self
            .lines
            .iter()
            .filter(|l| !exempt.contains(l))
            .cloned()
            .collect();
        (History::from_lines(judged), exempt)
    }

    /// The writes of `seq` after `t`.
    pub fn writes_after(&self, seq: &str, t: u128) -> Vec<&Line> {
        self.lines
            .iter()
            .filter(|l| l.seq == seq && l.kind == Kind::Write && l.t > t)
            .collect()
    }

    /// Each sequencer's writes, ordered by first write.
    pub fn spans(&self) -> Vec<Span> {
        let mut by_seq: BTreeMap<&str, Span> = BTreeMap::new();
        for l in self.lines.iter().filter(|l| l.kind == Kind::Write) {
            by_seq
                .entry(&l.seq)
                .and_modify(|s| {
                    s.first = s.first.min(l.t);
                    s.last = s.last.max(l.t);
                    s.writes += 1;
                })
                .or_insert_with(|| Span {
                    seq: l.seq.clone(),
                    pid: l.pid,
                    first: l.t,
                    last: l.t,
                    writes: 1,
                });
        }
        let mut spans: Vec<Span> = by_seq.into_values().collect();
        spans.sort_by_key(|s| (s.first, s.last));
        spans
    }

    /// The most sequencers whose write intervals (first to last write) were open at one instant,
    /// judged against `limit`. Load the histories of one lease (one key or semaphore) only.
    /// Intervals that only touch do not overlap.
    pub fn max_concurrent_writers(&self, limit: usize) -> Overlap {
        let spans = self.spans();
        let mut events: Vec<(u128, i8, usize)> = Vec::with_capacity(spans.len() * 2);
        for (i, s) in spans.iter().enumerate() {
            events.push((s.first, 1, i));
            events.push((s.last, -1, i));
        }
        // Ends before starts at one instant; a one-write span opens and closes at once.
        events.sort_by_key(|&(t, delta, _)| (t, delta));
        let mut open = std::collections::BTreeSet::new();
        let mut worst = Overlap {
            count: 0,
            limit,
            at: 0,
            spans: Vec::new(),
        };
        for (t, delta, i) in events {
            if delta > 0 {
                if spans[i].first == spans[i].last {
                    // A single write: count it at its instant, then close it.
                    open.insert(i);
                    if open.len() > worst.count {
                        worst.count = open.len();
                        worst.at = t;
                        worst.spans = open.iter().map(|&j| spans[j].clone()).collect();
                    }
                    open.remove(&i);
                    continue;
                }
                open.insert(i);
                if open.len() > worst.count {
                    worst.count = open.len();
                    worst.at = t;
                    worst.spans = open.iter().map(|&j| spans[j].clone()).collect();
                }
            } else {
                open.remove(&i);
            }
        }
        worst
    }

    /// Writes by a sequencer after another sequencer of its slot began writing: with `S.first <
    /// S'.first < t`, S's write at `t` is stale.
    ///
    /// A slot is a leader key (Consul, memory) or an AMQP slot `(semaphore, slot number)`; a
    /// Consul semaphore's holders have no slot of their own (see
    /// [`stale_writes_shared`](Self::stale_writes_shared)).
    pub fn stale_writes(&self) -> Vec<StaleWrite> {
        let mut groups: BTreeMap<String, Vec<Span>> = BTreeMap::new();
        for span in self.spans() {
            groups.entry(slot_of(&span.seq)).or_default().push(span);
        }
        groups
            .values()
            .flat_map(|spans| self.superseded(spans, 1))
            .collect()
    }

    /// Stale writes among the holders of a Consul semaphore with `limit` slots, whose sequencers
    /// (`<prefix>/<session>`) name no slot: S was superseded once `limit` sequencers that began
    /// after S's first write were writing at one instant (all slots taken by newer holders);
    /// every later write by S is stale. For `limit` 1 this is [`stale_writes`](Self::stale_writes).
    pub fn stale_writes_shared(&self, limit: usize) -> Vec<StaleWrite> {
        let mut groups: BTreeMap<String, Vec<Span>> = BTreeMap::new();
        for span in self.spans() {
            groups.entry(prefix_of(&span.seq)).or_default().push(span);
        }
        groups
            .values()
            .flat_map(|spans| self.superseded(spans, limit.max(1)))
            .collect()
    }

    /// The stale writes within one slot space of `limit` slots; `spans` ordered by first write.
    fn superseded(&self, spans: &[Span], limit: usize) -> Vec<StaleWrite> {
        let mut stale = Vec::new();
        for s in spans {
            let newer: Vec<&Span> = spans.iter().filter(|n| n.first > s.first).collect();
            let Some((at, by)) = first_instant_with(&newer, limit) else {
                continue;
            };
            if s.last <= at {
                continue;
            }
            for w in self.writes_after(&s.seq, at) {
                stale.push(StaleWrite {
                    seq: s.seq.clone(),
                    pid: s.pid,
                    t: w.t,
                    newer_seq: by.seq.clone(),
                    newer_pid: by.pid,
                    superseded_at: at,
                });
            }
        }
        stale.sort_by_key(|w| w.t);
        stale
    }

    /// From each sequencer's last write to the next sequencer's first write (by first write).
    /// Meaningful for a leader key.
    pub fn handoff_gaps(&self) -> Vec<Handoff> {
        self.spans()
            .windows(2)
            .map(|w| Handoff {
                from: w[0].seq.clone(),
                to: w[1].seq.clone(),
                gap_ms: ms(w[1].first as i128 - w[0].last as i128),
            })
            .collect()
    }

    /// The merged interleaving around instant `t`: `radius` lines before and after, each with its
    /// offset from `t` in ms.
    pub fn around(&self, t: u128, radius: usize) -> String {
        let at = self.lines.partition_point(|l| l.t < t);
        let from = at.saturating_sub(radius);
        let to = (at + radius + 1).min(self.lines.len());
        let mut out = String::new();
        for (i, l) in self.lines[from..to].iter().enumerate() {
            let mark = if from + i == at { ">>" } else { "  " };
            out.push_str(&format!(
                "{mark} {:+10.3} ms  pid {:>7} {:<8} {} {}\n",
                ms(l.t as i128 - t as i128),
                l.pid,
                l.kind.to_string(),
                l.seq,
                l.detail
            ));
        }
        out
    }
}

/// The first instant at which `limit` of `spans` are open at once, and the span whose start
/// made it so.
fn first_instant_with<'a>(spans: &[&'a Span], limit: usize) -> Option<(u128, &'a Span)> {
    let mut events: Vec<(u128, i8, usize)> = Vec::with_capacity(spans.len() * 2);
    for (i, s) in spans.iter().enumerate() {
        events.push((s.first, 1, i));
        events.push((s.last, -1, i));
    }
    // Starts before ends at one instant: a span is open at its first and its last write.
    events.sort_by_key(|&(t, delta, _)| (t, -delta));
    let mut open = 0usize;
    for (t, delta, i) in events {
        if delta > 0 {
            open += 1;
            if open >= limit {
                return Some((t, spans[i]));
            }
        } else {
            open -= 1;
        }
    }
    None
}

/// The slot a sequencer holds: AMQP `(semaphore, slot)`; otherwise its key.
fn slot_of(seq: &str) -> String {
    match seq.parse::<Sequencer>() {
        Ok(s) if s.backend() == BackendKind::Amqp => format!("{}#{}", s.key(), s.index()),
        Ok(s) => s.key().to_owned(),
        Err(_) => seq.to_owned(),
    }
}

/// A Consul semaphore holder's prefix (its contender key's parent); otherwise [`slot_of`].
fn prefix_of(seq: &str) -> String {
    match seq.parse::<Sequencer>() {
        Ok(s) if s.backend() != BackendKind::Amqp => s
            .key()
            .rsplit_once('/')
            .map_or_else(|| s.key().to_owned(), |(prefix, _)| prefix.to_owned()),
        _ => slot_of(seq),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "consul:1:aaaa:svc/leader";
    const B: &str = "consul:2:bbbb:svc/leader";
    const C: &str = "consul:3:cccc:svc/leader";

    fn h(lines: &[(u128, u32, &str, &str)]) -> History {
        let text: String = lines
            .iter()
            .map(|(t, pid, event, seq)| format!("{t} {pid} {event} {seq}\n"))
            .collect();
        History::parse(&text).unwrap()
    }

    #[test]
    fn parses_lines_with_details_and_rejects_garbage() {
        let hist = History::parse(
            "20 7 lost consul:1:aaaa:k the session was invalidated\n\n10 7 acquired consul:1:aaaa:k\n30 7 released consul:1:aaaa:k err lost\n40 7 exit -\n",
        )
        .unwrap();
        let kinds: Vec<_> = hist.lines().iter().map(|l| l.kind.clone()).collect();
        assert_eq!(
            kinds,
            [Kind::Acquired, Kind::Lost, Kind::Released, Kind::Exit]
        );
        assert_eq!(hist.lines()[1].detail, "the session was invalidated");
        assert_eq!(hist.lines()[2].detail, "err lost");
        assert!(History::parse("x 1 write s\n").is_err());
        assert!(History::parse("1\n").is_err());
    }

    #[test]
    fn sequential_holders_never_overlap_and_have_no_stale_writes() {
        let hist = h(&[
            (10, 1, "write", A),
            (20, 1, "write", A),
            (30, 2, "write", B),
            (40, 2, "write", B),
            (40, 1, "lost", A),
            (50, 1, "write", C),
        ]);
        let worst = hist.max_concurrent_writers(1);
        assert_eq!(worst.count, 1);
        assert!(!worst.exceeds_limit());
        assert!(hist.stale_writes().is_empty());
        let gaps: Vec<f64> = hist.handoff_gaps().iter().map(|g| g.gap_ms).collect();
        assert_eq!(gaps, [10e-6, 10e-6]);
    }

    #[test]
    fn an_old_holder_writing_after_the_new_one_began_is_stale_and_overlaps() {
        let hist = h(&[
            (10, 1, "write", A),
            (30, 2, "write", B),
            (35, 1, "write", A),
            (36, 1, "write", A),
            (50, 2, "write", B),
        ]);
        let worst = hist.max_concurrent_writers(1);
        assert_eq!(worst.count, 2);
        assert!(worst.exceeds_limit());
        assert_eq!(worst.at, 30);
        let stale = hist.stale_writes();
        assert_eq!(stale.len(), 2);
        assert_eq!((stale[0].pid, stale[0].t, stale[0].newer_pid), (1, 35, 2));
        assert_eq!(stale[0].superseded_at, 30);
        assert!((stale[1].after_ms() - 6e-6).abs() < 1e-12);
        assert!(hist.around(35, 2).contains(">>"));
        assert!(
            hist.handoff_gaps().iter().any(|h| h.gap_ms < 0.0),
            "overlap shows as a negative gap"
        );
    }

    #[test]
    fn a_stale_write_needs_no_overlap_of_first_to_last_intervals_to_be_found() {
        // B began and finished inside A's silence; A's later write is stale all the same.
        let hist = h(&[
            (10, 1, "write", A),
            (20, 2, "write", B),
            (21, 2, "write", B),
            (30, 1, "write", A),
        ]);
        assert_eq!(hist.stale_writes().len(), 1);
        assert_eq!(hist.max_concurrent_writers(1).count, 2);
    }

    #[test]
    fn different_keys_and_amqp_slots_do_not_supersede_each_other() {
        let hist = h(&[
            (10, 1, "write", "consul:1:aaaa:k1"),
            (20, 2, "write", "consul:1:bbbb:k2"),
            (30, 1, "write", "consul:1:aaaa:k1"),
            (10, 3, "write", "amqp:1:q-1-B#x:sem"),
            (20, 4, "write", "amqp:2:q-2-B#y:sem"),
            (30, 3, "write", "amqp:1:q-1-B#x:sem"),
        ]);
        assert!(hist.stale_writes().is_empty());
        let again = h(&[
            (10, 3, "write", "amqp:1:q-1-B#x:sem"),
            (20, 4, "write", "amqp:1:q-1-B#y:sem"),
            (30, 3, "write", "amqp:1:q-1-B#x:sem"),
        ]);
        assert_eq!(again.stale_writes().len(), 1);
    }

    #[test]
    fn a_shared_semaphore_holder_is_stale_once_limit_newer_holders_write_at_once() {
        let s = |n: u32| format!("consul:{n}:s{n}:sem/s{n}");
        let (s1, s2, s3, s4) = (s(1), s(2), s(3), s(4));
        // Limit 2: S2 and S3 start after S1, but never write at the same time: S1 is not stale.
        let fine = h(&[
            (10, 1, "write", &s1),
            (20, 2, "write", &s2),
            (25, 2, "write", &s2),
            (30, 3, "write", &s3),
            (35, 3, "write", &s3),
            (40, 1, "write", &s1),
        ]);
        assert!(fine.stale_writes_shared(2).is_empty());
        assert_eq!(fine.max_concurrent_writers(2).count, 2);
        // S3 and S4 write at once after S1 began: both slots were taken by newer holders.
        let bad = h(&[
            (10, 1, "write", &s1),
            (20, 3, "write", &s3),
            (25, 4, "write", &s4),
            (30, 3, "write", &s3),
            (31, 4, "write", &s4),
            (40, 1, "write", &s1),
            (41, 2, "write", &s2),
        ]);
        let stale = bad.stale_writes_shared(2);
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert_eq!(
            (stale[0].pid, stale[0].t, stale[0].superseded_at),
            (1, 40, 25)
        );
        assert!(bad.max_concurrent_writers(2).exceeds_limit());
        // With one slot, the shared rule is the leader rule: S1 is stale after S3 began (its
        // write at 40), S3 after S4 began (its write at 30).
        let one: Vec<(u32, u128)> = bad
            .stale_writes_shared(1)
            .iter()
            .map(|w| (w.pid, w.t))
            .collect();
        assert_eq!(one, [(3, 30), (1, 40)]);
    }

    #[test]
    fn a_file_read_mid_append_leaves_its_unterminated_tail() {
        let dir = std::env::temp_dir().join(format!("history-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.history");
        std::fs::write(&path, format!("10 1 write {A}\n20 1 wri")).unwrap();
        let hist = History::load(&[&path]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(hist.lines().len(), 1);
        assert_eq!(hist.lines()[0].t, 10);
    }

    #[test]
    fn touching_intervals_do_not_overlap() {
        let hist = h(&[
            (10, 1, "write", A),
            (20, 1, "write", A),
            (20, 2, "write", B),
        ]);
        assert_eq!(hist.max_concurrent_writers(1).count, 1);
    }
}
