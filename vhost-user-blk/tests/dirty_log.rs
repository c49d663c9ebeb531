//! The dirty log as a frontend sees it, through the socket: a log handed over with
//! `SET_LOG_BASE` under `LOG_SHMFD`, and while `VHOST_F_LOG_ALL` is on the pages the device
//! wrote marked in it, bit by bit: exactly the pages of a read's buffers, of its status byte
//! and of the used ring (element and index), and nothing else; only status and used ring for
//! a write; nothing with logging off, nothing of the used ring without `VHOST_VRING_F_LOG`;
//! a replaced log gets the later marks and the old one none; `GET_VRING_BASE` answers once
//! every completed request is marked; a log that cannot be mapped ends the connection.

mod common;

use std::collections::BTreeSet;

use aio_virtio_blk::driver::DriverRequest;
use aio_virtio_blk::spec;
use vhost::VhostBackend;

use common::{backend, clear, marked, union, Setup, Vm, DATA_BYTES, LOG_ALL, LOG_BYTES};

const LOGGING: Setup = Setup {
    log_all: true,
    vring_log: true,
};

fn read(sector: u64) -> DriverRequest {
    DriverRequest {
        kind: spec::T_IN,
        sector,
        len: DATA_BYTES,
    }
}

fn write(sector: u64) -> DriverRequest {
    DriverRequest {
        kind: spec::T_OUT,
        sector,
        len: DATA_BYTES,
    }
}

#[test]
fn a_read_marks_its_buffers_its_status_and_the_used_ring_and_nothing_else() {
    let backend = backend();
    let mut vm = Vm::connect(&backend, LOGGING);
    let log = vm.set_log(LOG_BYTES).unwrap();
    assert_eq!(marked(&log), BTreeSet::new(), "nothing written yet");

    let done = vm.run(1, read(16));
    assert_eq!((done.status, done.written), (spec::S_OK, DATA_BYTES + 1));
    let mut data = vec![0u8; DATA_BYTES as usize];
    vm.driver.read_data(1, &mut data).unwrap();
    assert!(data[..4096].iter().all(|&b| b == 2) && data[4096..].iter().all(|&b| b == 3));
    let expected = union([
        vm.data_pages(1, DATA_BYTES),
        vm.status_pages(1),
        vm.used_pages(0),
    ]);
    // The slot's buffer straddles three pages; with the status and the ring, five.
    assert_eq!(expected.len(), 5, "{expected:x?}");
    assert_eq!(marked(&log), expected);

    // GET_ID writes 20 bytes of the buffer: its first page only.
    clear(&log);
    let done = vm.run(
        2,
        DriverRequest {
            kind: spec::T_GET_ID,
            sector: 0,
            len: 512,
        },
    );
    assert_eq!(done.status, spec::S_OK);
    let expected = union([vm.data_pages(2, 20), vm.status_pages(2), vm.used_pages(1)]);
    assert_eq!(marked(&log), expected);
}

#[test]
fn a_write_marks_only_its_status_and_the_used_ring() {
    let backend = backend();
    let mut vm = Vm::connect(&backend, LOGGING);
    let log = vm.set_log(LOG_BYTES).unwrap();
    vm.driver
        .write_data(0, &[0xa5; DATA_BYTES as usize])
        .unwrap();
    assert_eq!(vm.run(0, write(8)).status, spec::S_OK);
    assert_eq!(marked(&log), union([vm.status_pages(0), vm.used_pages(0)]));
}

#[test]
fn with_log_all_off_nothing_is_marked_until_it_is_turned_on_while_running() {
    let backend = backend();
    let mut vm = Vm::connect(
        &backend,
        Setup {
            log_all: false,
            vring_log: true,
        },
    );
    let log = vm.set_log(LOG_BYTES).unwrap();
    assert_eq!(vm.run(0, read(0)).status, spec::S_OK);
    assert_eq!(marked(&log), BTreeSet::new(), "logging is off");

    // VHOST_F_LOG_ALL alone turns it on for the running queue.
    vm.frontend.set_features(vm.features() | LOG_ALL).unwrap();
    vm.sync();
    assert_eq!(vm.run(1, read(0)).status, spec::S_OK);
    let expected = union([
        vm.data_pages(1, DATA_BYTES),
        vm.status_pages(1),
        vm.used_pages(1),
    ]);
    assert_eq!(marked(&log), expected);

    // A migration ends as QEMU ends it (features, then the ring without the flag), and one
    // starts again.
    clear(&log);
    vm.set_logging(false);
    assert_eq!(vm.run(2, read(0)).status, spec::S_OK);
    assert_eq!(marked(&log), BTreeSet::new(), "logging is off again");
    vm.set_logging(true);
    assert_eq!(vm.run(3, read(0)).status, spec::S_OK);
    let expected = union([
        vm.data_pages(3, DATA_BYTES),
        vm.status_pages(3),
        vm.used_pages(3),
    ]);
    assert_eq!(marked(&log), expected);
}

#[test]
fn without_vring_f_log_the_used_ring_is_not_marked() {
    let backend = backend();
    let mut vm = Vm::connect(
        &backend,
        Setup {
            log_all: true,
            vring_log: false,
        },
    );
    let log = vm.set_log(LOG_BYTES).unwrap();
    assert_eq!(vm.run(3, read(4)).status, spec::S_OK);
    assert_eq!(
        marked(&log),
        union([vm.data_pages(3, DATA_BYTES), vm.status_pages(3)])
    );
}

#[test]
fn a_replaced_log_gets_the_later_marks_and_the_old_one_none() {
    let backend = backend();
    let mut vm = Vm::connect(&backend, LOGGING);
    let first = vm.set_log(LOG_BYTES).unwrap();
    assert_eq!(vm.run(0, read(0)).status, spec::S_OK);
    assert_eq!(
        marked(&first),
        union([
            vm.data_pages(0, DATA_BYTES),
            vm.status_pages(0),
            vm.used_pages(0)
        ])
    );
    clear(&first);

    // A larger log, as QEMU sends when the guest's memory grew.
    let second = vm.set_log(2 * LOG_BYTES).unwrap();
    assert_eq!(vm.run(1, read(0)).status, spec::S_OK);
    assert_eq!(marked(&first), BTreeSet::new(), "the old log is left alone");
    assert_eq!(
        marked(&second),
        union([
            vm.data_pages(1, DATA_BYTES),
            vm.status_pages(1),
            vm.used_pages(1)
        ])
    );
}

#[test]
fn get_vring_base_answers_once_every_completed_request_is_marked() {
    let backend = backend();
    let mut vm = Vm::connect(&backend, LOGGING);
    let log = vm.set_log(LOG_BYTES).unwrap();
    for slot in 0..common::SLOTS {
        vm.driver.post(slot, read(u64::from(slot) * 16)).unwrap();
    }
    vm.driver.notify().unwrap();
    // Stops the ring at once, whatever the iothread has taken by now.
    let base = vm.frontend.get_vring_base(0).unwrap() as u16;
    let mut done = Vec::new();
    vm.driver.take_used(&mut done).unwrap();
    assert_eq!(
        done.len(),
        usize::from(base),
        "every request taken has completed"
    );
    let mut expected = BTreeSet::new();
    for (i, finished) in done.iter().enumerate() {
        assert_eq!(finished.status, spec::S_OK);
        expected.extend(vm.data_pages(finished.slot, DATA_BYTES));
        expected.extend(vm.status_pages(finished.slot));
        expected.extend(vm.used_pages(i as u16));
    }
    if base == 0 {
        // Nothing was taken: only the used ring's flags may have been written.
        expected.extend(vm.used_pages(0));
        assert!(marked(&log).is_subset(&expected), "{:x?}", marked(&log));
    } else {
        assert_eq!(marked(&log), expected);
    }
}

#[test]
fn a_log_that_cannot_be_mapped_ends_the_connection() {
    let backend = backend();
    let vm = Vm::connect(&backend, LOGGING);
    let short = tempfile::tempfile().unwrap();
    short.set_len(LOG_BYTES / 2).unwrap();
    assert!(vm.set_log_file(&short, LOG_BYTES).is_err(), "no answer");
    assert!(
        vm.frontend.get_features().is_err(),
        "the connection is gone"
    );
}
