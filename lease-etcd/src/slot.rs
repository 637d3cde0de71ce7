//! The holder part of a contender's key, `<lease hex>` or `<lease hex>_<n>`: its place among the
//! contenders of one name on one pooled etcd lease (see the `pool` module).
//!
//! The first contender of a pooled lease under a name holds `<lease hex>`, exactly as etcd's
//! election recipe (`etcdctl elect`, `etcdctl lock`) names its keys; more contenders of that
//! lease under that name hold `<lease hex>_<n>` (n = 1, 2, … in decimal, never given twice on one
//! lease), so 10,000 waiters of one process on one name are 10,000 keys on one etcd lease. The
//! recipe orders a name's keys by create revision only and never parses their suffix (clientv3
//! `concurrency`: `Campaign` and `Mutex.Lock` write `<prefix><own lease %x>` and wait for the
//! deletion of the newest older key), so those keys interoperate with ours; an underscore is not
//! a hex digit, so no slot of one lease names another lease's key.
//!
//! The sequencer's holder is this suffix; what reads a lease back from a holder
//! (`Etcd::check_sequencer`, `Etcd::revoke_lease`, the observer, the test support's `revoke`)
//! takes the hex before `_`.

use std::fmt;

/// A contender's place among the contenders of one name on one pooled lease: the holder part of
/// its key. Slot 0 is the etcd lease ID in lowercase hex, exactly as etcd's election recipe
/// (`etcdctl elect`, `etcdctl lock`) names its keys; slot n > 0 is `<lease hex>_<n>` (n in
/// decimal). An underscore is no hex digit, so no slot of one lease is ever a key of another, and
/// the lease a key belongs to is read back from the part before it ([`Slot::parse`]). etcd's
/// recipe never parses the key's suffix: it orders a name's keys by create revision only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) lease: i64,
    pub(crate) n: u64,
}

impl Slot {
    /// The slot a holder string names, if it names one: `<hex>` or `<hex>_<n>` with n ≥ 1 in
    /// decimal without leading zeros, the lease positive.
    pub(crate) fn parse(holder: &str) -> Option<Slot> {
        let (hex, n) = match holder.split_once('_') {
            Some((_, n)) if n.starts_with('0') || !n.bytes().all(|b| b.is_ascii_digit()) => {
                return None;
            }
            Some((hex, n)) => (hex, n.parse().ok()?),
            None => (holder, 0),
        };
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let lease = i64::from_str_radix(hex, 16).ok().filter(|id| *id > 0)?;
        Some(Slot { lease, n })
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.n {
            0 => write!(f, "{:x}", self.lease),
            n => write!(f, "{:x}_{n}", self.lease),
        }
    }
}

/// The lease ID as `etcdctl` writes it in key names: lowercase hex.
pub(crate) fn holder_of(id: i64) -> String {
    format!("{id:x}")
}

/// The lease ID a sequencer's holder names (`<lease hex>` or `<lease hex>_<n>`), if it is one.
pub(crate) fn lease_of(holder: &str) -> Option<i64> {
    Slot::parse(holder).map(|slot| slot.lease)
}

/// The holder a contender key of `name` names: the part after `<name>/` if it is a slot of the
/// key's own lease `lease` (ours, or etcd's election recipe's), else that lease in hex.
pub(crate) fn holder_in(name: &str, key: &str, lease: i64) -> String {
    key.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|holder| Slot::parse(holder).is_some_and(|slot| slot.lease == lease))
        .map_or_else(|| holder_of(lease), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::{Slot, holder_in};

    #[test]
    fn a_slot_is_written_and_read_back() {
        for (holder, lease, n) in [
            ("1a2b", 0x1a2b, 0),
            ("1a2b_1", 0x1a2b, 1),
            ("7f_12", 0x7f, 12),
        ] {
            let slot = Slot::parse(holder).unwrap();
            assert_eq!(slot, Slot { lease, n });
            assert_eq!(slot.to_string(), holder);
        }
    }

    #[test]
    fn only_a_lease_in_hex_with_an_optional_decimal_slot_is_a_slot() {
        for holder in [
            "", "_1", "1a2b_", "1a2b_0", "1a2b_01", "1a2b_x", "1a2b_1_2", "0", "-1", "+1a", "xyz",
            "1a2b/1",
        ] {
            assert_eq!(Slot::parse(holder), None, "{holder:?}");
        }
    }

    #[test]
    fn the_holder_of_a_key_is_its_slot_of_its_own_lease() {
        assert_eq!(holder_in("q", "q/1a2b", 0x1a2b), "1a2b");
        assert_eq!(holder_in("q", "q/1a2b_3", 0x1a2b), "1a2b_3");
        // A key that does not name its own lease is named by its lease.
        assert_eq!(holder_in("q", "q/ff_3", 0x1a2b), "1a2b");
        assert_eq!(holder_in("q", "q/other", 0x1a2b), "1a2b");
        assert_eq!(holder_in("q", "qq/1a2b", 0x1a2b), "1a2b");
    }
}
