//! Events go to containerd from one thread, in the order they were sent, so an RPC never waits
//! on containerd and TaskStart can never overtake TaskExit. The Task layer sees an
//! [`EventSink`]; tests give it one that records.

use std::{
    sync::mpsc::{channel, sync_channel, Sender, SyncSender},
    time::{Duration, SystemTime},
};

use containerd_shim::{
    protos::{
        protobuf::{well_known_types::timestamp::Timestamp, MessageDyn},
        ttrpc::context::Context,
    },
    publisher::RemotePublisher,
};

/// `t` as the protobuf timestamp containerd's events and replies carry.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut ts = Timestamp::new();
    ts.seconds = d.as_secs() as i64;
    ts.nanos = d.subsec_nanos() as i32;
    ts
}

enum Message {
    Event(&'static str, Box<dyn MessageDyn>),
    /// Answered once every event sent before it has been published.
    Flush(SyncSender<()>),
}

/// Where the Task layer's events go.
pub trait EventSink: Send + Sync {
    fn send(&self, topic: &'static str, event: Box<dyn MessageDyn>);
    /// Waits (up to `timeout`) until what was sent so far is published.
    fn flush(&self, timeout: Duration);
}

impl dyn EventSink + '_ {
    pub fn publish(&self, topic: &'static str, event: impl MessageDyn) {
        self.send(topic, Box::new(event));
    }
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
}

impl EventSink for EventSender {
    fn send(&self, topic: &'static str, event: Box<dyn MessageDyn>) {
        log::debug!("event {topic}");
        if self.0.send(Message::Event(topic, event)).is_err() {
            log::error!("event publisher is gone; dropped {topic}");
        }
    }

    /// The shim exits right after Shutdown, and the last TaskDelete must not go with it.
    fn flush(&self, timeout: Duration) {
        let (done, published) = sync_channel(1);
        if self.0.send(Message::Flush(done)).is_ok() && published.recv_timeout(timeout).is_err() {
            log::warn!("events not all published within {timeout:?} of shutting down");
        }
    }
}
