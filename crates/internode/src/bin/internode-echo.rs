//! A messenger in its own process, for tests that stop it with signals:
//! `internode-echo LISTEN_ADDR HOST_ID`. It prints `listening ADDR` once bound, answers every
//! Requests-class call with its body, and exits when its standard input closes.

use std::io::{BufRead, Write};

use sluice_internode::{ConnectionClass, Messenger, MessengerConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(host_id)) = (args.next(), args.next()) else {
        eprintln!("usage: internode-echo LISTEN_ADDR HOST_ID");
        std::process::exit(2);
    };
    let listen = listen.parse().expect("LISTEN_ADDR is ip:port");
    let host_id: u128 = host_id.parse().expect("HOST_ID is an integer");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let messenger = Messenger::bind(MessengerConfig::new("Test Cluster", host_id, listen))
            .await
            .expect("bind");
        let mut requests = messenger
            .take_inbound(ConnectionClass::Requests)
            .expect("requests queue");
        tokio::spawn(async move {
            while let Some(message) = requests.recv().await {
                let body = message.body.clone();
                message.reply(body);
            }
        });
        println!("listening {}", messenger.local_addr());
        std::io::stdout().flush().expect("stdout");
        // Standard input closing (the test ended or died) ends the process.
        tokio::task::spawn_blocking(|| {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
            }
        })
        .await
        .expect("stdin watcher");
        messenger.shutdown().await;
    });
}
