//! Events go to containerd from one thread, in the order they were sent, so an RPC never waits
//! on containerd and TaskStart can never overtake TaskExit.

use std::sync::mpsc::{channel, Sender};

use containerd_shim::{
    protos::{protobuf::MessageDyn, ttrpc::context::Context},
    publisher::RemotePublisher,
};

pub type Event = (&'static str, Box<dyn MessageDyn>);

#[derive(Clone)]
pub struct EventSender(Sender<Event>);

impl EventSender {
    /// Publishes on a thread of its own through containerd's ttrpc event service.
    pub fn spawn(publisher: RemotePublisher, namespace: String) -> Self {
        let (tx, rx) = channel::<Event>();
        std::thread::Builder::new()
            .name("events".into())
            .spawn(move || {
                for (topic, event) in rx {
                    if let Err(e) = publisher.publish(Context::default(), topic, &namespace, event)
                    {
                        log::error!("publish {topic}: {e}");
                    }
                }
            })
            .expect("spawn event publisher");
        EventSender(tx)
    }

    pub fn send(&self, topic: &'static str, event: impl MessageDyn) {
        log::debug!("event {topic}");
        if self.0.send((topic, Box::new(event))).is_err() {
            log::error!("event publisher is gone; dropped {topic}");
        }
    }
}
