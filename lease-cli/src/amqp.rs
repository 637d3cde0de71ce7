//! `lease amqp …`: administration of RabbitMQ persistent semaphores, through the library's
//! [`Admin`](lease_amqp::Admin).

use lease_amqp::{AMQP_URL_ENV, Amqp};

use crate::cli::{AmqpCommand, AmqpUrl};
use crate::exit::Failure;

pub(crate) async fn run(command: AmqpCommand) -> Result<u8, Failure> {
    let url = match &command {
        AmqpCommand::Create { url, .. }
        | AmqpCommand::Destroy { url, .. }
        | AmqpCommand::Add { url, .. }
        | AmqpCommand::Remove { url, .. }
        | AmqpCommand::Wait { url, .. } => url,
    };
    let amqp = connect(url)?;
    let admin = amqp.admin();
    let result = match command {
        AmqpCommand::Create { name, slots, .. } => admin
            .create(&name, slots)
            .await
            .map(|()| format!("{name}: {slots} slots")),
        AmqpCommand::Destroy { name, .. } => admin
            .destroy(&name)
            .await
            .map(|removed| format!("{name}: destroyed ({removed} slots removed)")),
        AmqpCommand::Add { name, count, .. } => admin
            .add(&name, count)
            .await
            .map(|slots| format!("{name}: {slots} slots")),
        AmqpCommand::Remove { name, count, .. } => admin
            .remove(&name, count)
            .await
            .map(|slots| format!("{name}: {slots} slots")),
        AmqpCommand::Wait {
            name,
            slot,
            timeout,
            ..
        } => admin
            .wait_for_holder(&name, slot, timeout)
            .await
            .map(|()| format!("{name}: slot {slot} has no holder")),
    };
    lease_core::Backend::shutdown(&amqp).await;
    match result {
        Ok(line) => {
            println!("{line}");
            Ok(0)
        }
        Err(error) => Err(Failure::from_error(&error)),
    }
}

fn connect(url: &AmqpUrl) -> Result<Amqp, Failure> {
    match &url.url {
        Some(url) => Amqp::new(url.clone()),
        None => Amqp::from_env(),
    }
    .map_err(|e| {
        Failure::usage(format_args!(
            "--amqp or {AMQP_URL_ENV}: {}",
            crate::exit::in_cli_terms(&e.to_string())
        ))
    })
}
