use lease_core::leader_only;

#[leader_only(key = "jobs/a", wait = "30")]
async fn no_unit() {}

#[leader_only(key = "jobs/a", wait = "3x")]
async fn bad_unit() {}

#[leader_only(key = "jobs/a", wait = "soon")]
async fn word() {}

#[leader_only(key = "jobs/a", wait = 30)]
async fn not_a_string() {}

#[leader_only(key = "jobs/a", wait = "")]
async fn empty() {}

#[leader_only(key = "jobs/a", ttl = "5s")]
async fn ttl_too_short() {}

#[leader_only(key = "jobs/a", ttl = "25h")]
async fn ttl_too_long() {}

#[leader_only(key = "jobs/a", ttl = "10500ms")]
async fn ttl_fraction() {}

#[leader_only(key = "jobs/a", lock_delay = "2m")]
async fn lock_delay_too_long() {}

#[leader_only(key = "jobs/a", ttl = "forever")]
async fn ttl_forever() {}

#[leader_only(key = "jobs/a", wait = "99999999999999999999h")]
async fn overflow() {}

fn main() {}
