use super::{entry::Entry, state::new_id, Out, State};

#[test]
fn ids_are_valid_container_ids_and_differ() {
    let (a, b) = (new_id(), new_id());
    assert_ne!(a, b);
    chalk_runtime::ids::container_id(&a).unwrap();
    assert_eq!(a.len(), "web-".len() + 8);
}

#[test]
fn an_operation_needs_the_right_state_and_no_other_under_way() {
    let e = Entry::new("web-1".into(), "me", None, (80, 24));
    assert!(e
        .begin("suspended", State::Running)
        .unwrap_err()
        .message
        .contains("starting"));
    e.lock().state = State::Running;
    e.begin("suspending", State::Running).unwrap();
    let busy = e.begin("splitting", State::Running).unwrap_err();
    assert_eq!(busy.status, 409);
    assert!(busy.message.contains("suspending"));
    e.end();
    assert!(e.begin("resuming", State::Suspended).is_err());
}

#[test]
fn subscribers_get_the_screen_then_what_follows() {
    let e = Entry::new("web-1".into(), "me", None, (80, 24));
    e.output(b"before\r\n");
    let (screen, mut rx) = e.subscribe();
    e.output(b"after");
    assert_eq!(screen, b"before\r\n");
    match rx.try_recv().unwrap() {
        Out::Bytes(b) => assert_eq!(&b[..], b"after"),
        Out::Event(_) => panic!("expected bytes"),
    }
}
