use lease_core::leader_only;

trait Job {
    #[leader_only(key = "jobs/trait")]
    async fn run(&self);
}

fn main() {}
