//! Events go to containerd from one thread, in the order they were sent, so an RPC never waits
//! on containerd and TaskStart can never overtake TaskExit.

use std::{
    sync::mpsc::{channel, sync_channel, Sender, SyncSender},
    time::Duration,
};

use containerd_shim::{
    protos::{protobuf::MessageDyn, ttrpc::context::Context},
    publisher::RemotePublisher,
};

enum Message {
    Event(&'static str, Box<dyn MessageDyn>),
    /// Answered once every event sent before it has been published.
    Flush(SyncSender<()>),
}

#[derive(Clone)]
pub struct EventSender(Sender<Message>);

impl EventSender {
    /// Publishes on a thread of its own through containerd's ttrpc event service.
    pub fn spawn(publisher: RemotePublisher, namespace: String) -> Self {
        let (tx, rx) = channel::<Message>();
        std::thread::Builder::new()
            .name("events".into())
            .spawn(move || {
                for message in rx {
                    match message {
                        Message::Event(topic, event) => {
                            if let Err(e) =
                                publisher.publish(Context::default(), topic, &namespace, event)
                            {
                                log::error!("publish {topic}: {e}");
                            }
                        }
                        Message::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .expect("spawn event publisher");
        EventSender(tx)
    }

    pub fn send(&self, topic: &'static str, event: impl MessageDyn) {
        log::debug!("event {topic}");
        if self.0.send(Message::Event(topic, Box::new(event))).is_err() {
            log::error!("event publisher is gone; dropped {topic}");
        }
    }

    /// Waits (up to `timeout`) until what was sent so far is published: the shim exits right
    /// after Shutdown, and the last TaskDelete must not go with it.
    pub fn flush(&self, timeout: Duration) {
        let (done, published) = sync_channel(1);
        if self.0.send(Message::Flush(done)).is_ok() && published.recv_timeout(timeout).is_err() {
            log::warn!("events not all published within {timeout:?} of shutting down");
        }
    }
}
