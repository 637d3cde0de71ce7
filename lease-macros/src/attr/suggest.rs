//! The errors for arguments the attribute does not take, with the name a misspelt one most
//! likely meant.

use super::kind::Kind;

/// The one error for an argument name the attribute does not take: the known names, and the
/// closest of them when the name looks like a misspelling of it.
pub(super) fn unknown_argument(kind: Kind, name: &str, close: Option<&str>) -> String {
    let accepted: Vec<String> = kind.accepted().iter().map(|a| format!("`{a}`")).collect();
    let hint = close.map_or_else(String::new, |close| format!("; did you mean `{close}`?"));
    format!(
        "unknown argument `{name}` for {}; expected one of {}{hint}",
        kind.attribute(),
        accepted.join(", ")
    )
}

/// The known name `name` is most likely a misspelling of, as rustc picks one for a misspelt
/// identifier: the same name in another case, the same `_`-separated words in another order
/// (`delay_lock`), or the nearest by edit distance within a third of the name's length
/// (at least 1).
pub(super) fn closest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    fn words(name: &str) -> Vec<&str> {
        let mut words: Vec<&str> = name.split('_').collect();
        words.sort_unstable();
        words
    }
    let name = name.to_lowercase();
    if let Some(same) = known
        .iter()
        .find(|known| **known == name || words(known) == words(&name))
    {
        return Some(*same);
    }
    let most = name.chars().count().max(3) / 3;
    known
        .iter()
        .map(|known| (edit_distance(&name, known), *known))
        .filter(|(distance, _)| *distance <= most)
        // The first of the nearest, so ties go to the order the docs list the arguments in.
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Edits (insert, delete, substitute, or swap two neighbours) to turn `a` into `b`: the
/// optimal string alignment distance, so `kye` is one edit from `key`.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back (for a swap), the previous one, the current one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            current[j] = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                current[j] = current[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

pub(super) fn unexpected_positional(kind: Kind) -> String {
    match kind {
        Kind::Leader => {
            "unexpected argument: #[leader_only] takes one positional argument, the key; \
                         name the others, e.g. `wait = \"30s\"`"
                .to_owned()
        }
        Kind::Semaphore => "unexpected argument: #[semaphore] takes two positional arguments, the \
                            name and the limit; name the others, e.g. `wait = \"30s\"`"
            .to_owned(),
    }
}
