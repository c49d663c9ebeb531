//! qemu-storage-daemon command lines read into the daemon's configuration, and refused.

use std::path::PathBuf;

use super::*;
use crate::blockdev::QEMU_EXPORT_SERIAL;
use aio::{Choice, EngineKind};
use aio_virtio_blk::format::ImageFormat;

fn args(line: &[&str]) -> Vec<String> {
    line.iter().map(|s| s.to_string()).collect()
}

fn parse(line: &[&str]) -> Result<QsdCommandLine, QsdError> {
    QsdCommandLine::parse(&args(line))
}

fn refusal(line: &[&str]) -> String {
    parse(line).unwrap_err().to_string()
}

const EXPORT: &str = "type=vhost-user-blk,id=e0,node-name=disk0,addr.type=unix,addr.path=/s.sock";

#[test]
fn a_qcow2_export_on_an_iothread_with_its_polling_and_the_process_options() {
    let line = parse(&[
        "--blockdev",
        "driver=file,node-name=file0,filename=/x.qcow2,cache.direct=on,aio=io_uring",
        "--blockdev",
        "driver=qcow2,node-name=disk0,file=file0",
        "--object",
        "iothread,id=io0,poll-max-ns=16384,poll-grow=4,poll-shrink=2",
        "--export",
        &format!("{EXPORT},writable=on,num-queues=2,iothread=io0"),
        "--pidfile",
        "/run/d.pid",
        "--daemonize",
        "--chardev",
        "socket,id=qmp0,path=/run/qmp.sock,server=on,wait=off",
        "--monitor",
        "chardev=qmp0",
    ])
    .unwrap();
    let c = &line.config;
    assert_eq!(c.disks.len(), 1);
    let d = &c.disks[0];
    assert_eq!(d.socket, PathBuf::from("/s.sock"));
    assert_eq!(d.image, PathBuf::from("/x.qcow2"));
    assert_eq!(
        (d.format, d.queues, d.read_only, d.iothread),
        (ImageFormat::Qcow2, 2, false, Some(0))
    );
    assert_eq!(d.serial, QEMU_EXPORT_SERIAL);
    assert_eq!(c.engine, Choice::Named(EngineKind::Uring));
    // Every export names its iothread, but a monitor may add one that does not: the
    // iothread standing for QEMU's main loop is there too.
    assert_eq!(c.iothreads, 2);
    assert_eq!(c.iothread_poll[1].max_ns, 0, "the main loop does not poll");
    let p = c.iothread_poll[0];
    assert_eq!((p.max_ns, p.grow, p.shrink), (16384, 4, 2));
    assert_eq!(line.process.pidfile, Some(PathBuf::from("/run/d.pid")));
    assert_eq!(
        line.process.monitors,
        [super::Chardev::Listen(PathBuf::from("/run/qmp.sock"))]
    );
    assert!(line.process.daemonize);
}

#[test]
fn the_json_form_and_inline_children_read_as_the_keyval_form() {
    let keyval = parse(&[
        "--blockdev",
        "driver=file,node-name=f,filename=/x.img,aio=native,cache.direct=on",
        "--blockdev",
        "driver=raw,node-name=disk0,file=f",
        "--export",
        EXPORT,
    ])
    .unwrap();
    let json = parse(&[
        "--blockdev",
        r#"{"driver": "raw", "node-name": "disk0", "file": {"driver": "file",
            "filename": "/x.img", "aio": "native", "cache": {"direct": true}}}"#,
        "--export",
        r#"{"type": "vhost-user-blk", "id": "e0", "node-name": "disk0",
            "addr": {"type": "unix", "path": "/s.sock"}}"#,
    ])
    .unwrap();
    assert_eq!(
        (&keyval.config, &keyval.process),
        (&json.config, &json.process)
    );
    let inline = parse(&[
        "--blockdev=driver=raw,node-name=disk0,file.driver=file,file.filename=/x.img,\
         file.aio=native,file.cache.direct=on",
        &format!("--export={EXPORT}"),
    ])
    .unwrap();
    assert_eq!(
        (&keyval.config, &keyval.process),
        (&inline.config, &inline.process)
    );
    assert_eq!(keyval.config.engine, Choice::Named(EngineKind::LinuxAio));
}

#[test]
fn qemus_defaults_hold_where_unsaid() {
    let line = parse(&[
        "--blockdev",
        "driver=host_device,node-name=disk0,filename=/dev/loop0",
        "--export",
        EXPORT,
    ])
    .unwrap();
    let (c, d) = (&line.config, &line.config.disks[0]);
    assert!(d.read_only, "an export is read-only unless writable=on");
    assert_eq!((d.format, d.queues), (ImageFormat::Raw, 1));
    assert_eq!(c.engine, Choice::Named(EngineKind::Pool), "aio=threads");
    // The export runs where QEMU's main loop would: an iothread that does not poll.
    assert_eq!((c.iothreads, d.iothread), (1, Some(0)));
    assert_eq!(c.iothread_poll[0].max_ns, 0);
    assert_eq!(line.process, Process::default());
}

#[test]
fn null_nodes_and_exports_beside_iothreads_take_their_own_iothread() {
    let line = parse(&[
        "--object",
        "iothread,id=io0",
        "--blockdev",
        "driver=null-co,node-name=n0,size=1G,read-zeroes=on",
        "--blockdev",
        "driver=null-aio,node-name=n1,size=64M",
        "--export",
        "type=vhost-user-blk,id=a,node-name=n0,addr.type=unix,addr.path=/a,iothread=io0",
        "--export",
        "type=vhost-user-blk,id=b,node-name=n1,addr.type=unix,addr.path=/b,writable=on",
    ])
    .unwrap();
    let c = &line.config;
    assert_eq!(c.iothreads, 2);
    assert_eq!(c.iothread_poll[0].max_ns, aio_loop::DEFAULT_POLL_MAX_NS);
    assert_eq!(c.iothread_poll[1].max_ns, 0);
    assert!(c.disks[0].is_null() && c.disks[1].is_null());
    assert_eq!(c.disks[0].size, Some(1 << 30));
    assert_eq!(
        (c.disks[0].iothread, c.disks[1].iothread),
        (Some(0), Some(1))
    );
    assert!(!c.disks[1].read_only);
}

#[test]
fn what_is_not_served_is_refused_by_name() {
    let file = "driver=file,node-name=disk0,filename=/x";
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--blockdev",
                file,
                "--export",
                "type=fuse,id=e,node-name=disk0",
            ],
            "'fuse' export",
        ),
        (
            &["--nbd-server", "addr.type=unix,addr.path=/s,tls-creds=t0"],
            "tls-creds",
        ),
        (
            &[
                "--blockdev",
                file,
                "--nbd-server",
                "addr.type=unix,addr.path=/s",
                "--export",
                "type=nbd,id=e,node-name=disk0,bitmaps.0.node=disk0",
            ],
            "'bitmaps.0.name' is missing",
        ),
        (
            &["--blockdev", "driver=vmdk,node-name=d,file=f"],
            "driver 'vmdk'",
        ),
        (
            &["--blockdev", &format!("{file},cache.direct=off")],
            "cache.direct=off",
        ),
        (
            &["--blockdev", &format!("{file},detect-zeroes=on")],
            "detect-zeroes=on",
        ),
        (
            &["--blockdev", &format!("{file},locking=maybe")],
            "locking=maybe",
        ),
        (&["--object", "secret,id=s,data=x"], "type 'secret'"),
        (&["--chardev", "socket,id=m,path=/m,server=on"], "wait=on"),
        (&["--chardev", "file,id=m,path=/m"], "'file' chardev"),
        (
            &["--chardev", "socket,id=m,path=/m,reconnect=1"],
            "reconnect",
        ),
        (&["--monitor", "chardev=m"], "names no --chardev"),
        (&["--fuse"], "'--fuse'"),
        (
            &["--blockdev", file, "--disk", "socket=/s,image=/i"],
            "not both",
        ),
        (
            &[
                "--blockdev",
                file,
                "--export",
                &format!("{EXPORT},logical-block-size=4096"),
            ],
            "4096",
        ),
        (
            &[
                "--blockdev",
                file,
                "--export",
                &EXPORT.replace("unix", "fd"),
            ],
            "addr.type=fd",
        ),
    ];
    for (line, named) in cases {
        let e = refusal(line);
        assert!(e.contains(named), "{line:?}: {e}");
    }
    assert!(matches!(
        parse(&["--blockdev", "driver=vmdk,node-name=d"]),
        Err(QsdError::NotServed { .. })
    ));
}

#[test]
fn inconsistent_command_lines_are_refused_with_what_is_wrong() {
    let file =
        |name: &str, aio: &str| format!("driver=file,node-name={name},filename=/{name},aio={aio}");
    let export = |node: &str, path: &str| {
        format!("type=vhost-user-blk,id={path},node-name={node},addr.type=unix,addr.path=/{path}")
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (args(&["--export", EXPORT]), "names no block node"),
        (
            args(&[
                "--blockdev",
                &file("disk0", "native"),
                "--export",
                &format!("{EXPORT},iothread=io9"),
            ]),
            "iothread 'io9'",
        ),
        (
            args(&["--blockdev", "driver=qcow2,node-name=q,file=nothing"]),
            "file=nothing",
        ),
        (
            args(&[
                "--blockdev",
                &file("a", "native"),
                "--blockdev",
                &file("b", "threads"),
                "--export",
                &export("a", "sa"),
                "--export",
                &export("b", "sb"),
            ]),
            "a second engine",
        ),
        (
            args(&[
                "--blockdev",
                &format!("{},read-only=on", file("disk0", "native")),
                "--export",
                &format!("{EXPORT},writable=on"),
            ]),
            "read-only",
        ),
        (
            args(&[
                "--blockdev",
                &file("a", "x"),
                "--blockdev",
                &file("a", "native"),
            ]),
            "aio=x",
        ),
        (
            args(&[
                "--blockdev",
                &file("a", "native"),
                "--blockdev",
                &file("a", "native"),
            ]),
            "twice",
        ),
        (args(&["--blockdev"]), "value is missing"),
        (args(&["--daemonize"]), "no export"),
        (
            args(&[
                "--blockdev",
                &file("disk0", "native"),
                "--export",
                &format!("{EXPORT},num-queues=0"),
            ]),
            "num-queues=0",
        ),
    ];
    for (line, named) in cases {
        let e = QsdCommandLine::parse(&line).unwrap_err().to_string();
        assert!(e.contains(named), "{line:?}: {e}");
    }
}

#[test]
fn a_command_line_is_qemu_storage_daemons_when_it_has_one_of_its_options() {
    assert!(is_qsd_command_line(&args(&["--blockdev", "x"])));
    assert!(is_qsd_command_line(&args(&["--export=x"])));
    assert!(!is_qsd_command_line(&args(&[
        "--disk",
        "socket=/s,image=/i"
    ])));
    // Both forms take --pidfile and --daemonize.
    assert!(!is_qsd_command_line(&args(&[
        "--disk",
        "socket=/s,image=/i",
        "--pidfile",
        "/p",
        "--daemonize"
    ])));
}

#[test]
fn nbd_servers_and_exports_are_read_into_the_daemons_nbd_config() {
    let c = parse(&[
        "--blockdev",
        "driver=file,node-name=f0,filename=/img",
        "--blockdev",
        "driver=qcow2,node-name=q0,file=f0",
        "--nbd-server",
        "addr.type=inet,addr.host=127.0.0.1,addr.port=10809,max-connections=4",
        "--export",
        "type=nbd,id=e0,node-name=q0,writable=on,description=the disk",
        "--export",
        "type=nbd,id=e1,node-name=q0,name=ro",
    ])
    .unwrap()
    .config;
    assert!(c.disks.is_empty());
    let server = c.nbd.expect("an NBD server");
    assert_eq!(server.max_connections, Some(4));
    assert_eq!(
        server.addr,
        aio_nbd::ListenAddr::Inet {
            host: "127.0.0.1".into(),
            port: 10809
        }
    );
    let names: Vec<_> = c.nbd_exports.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["q0", "ro"]);
    let e = &c.nbd_exports[0];
    assert_eq!((e.writable, e.format), (true, ImageFormat::Qcow2));
    assert_eq!(e.description.as_deref(), Some("the disk"));
    assert!(!c.nbd_exports[1].writable);
    let e = parse(&[
        "--blockdev",
        "driver=file,node-name=f0,filename=/img",
        "--export",
        "type=nbd,id=e0,node-name=f0",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("NBD server not running"), "{e}");
}

#[test]
fn implied_first_keys_read_as_the_keys_they_stand_for() {
    let explicit = parse(&[
        "--blockdev",
        "driver=file,node-name=f,filename=/x.img",
        "--blockdev",
        "driver=raw,node-name=disk0,file=f",
        "--nbd-server",
        "addr.type=unix,addr.path=/n.sock",
        "--export",
        "type=nbd,id=e1,node-name=disk0,writable=true",
        "--export",
        EXPORT,
    ])
    .unwrap();
    let implied = parse(&[
        "--blockdev",
        "file,node-name=f,filename=/x.img",
        "--blockdev",
        "raw,node-name=disk0,file=f",
        "--nbd-server",
        "addr.type=unix,addr.path=/n.sock",
        "--export",
        "nbd,id=e1,node-name=disk0,writable=true",
        "--export",
        &EXPORT.replace("type=vhost-user-blk", "vhost-user-blk"),
    ])
    .unwrap();
    // (The graphs differ only in the option text each node keeps for its errors.)
    assert_eq!(
        (&explicit.config, &explicit.process),
        (&implied.config, &implied.process)
    );
    assert_eq!(implied.config.nbd_exports.len(), 1);
    assert_eq!(implied.config.disks.len(), 1);
    assert!(refusal(&["--blockdev", "nfs,node-name=f"]).contains("'nfs'"));
}

#[test]
fn monitors_are_served_on_listening_client_and_stdio_chardevs() {
    let line = parse(&[
        "--blockdev",
        "null-co,node-name=n0,size=1M",
        "--chardev",
        "socket,id=a,path=/a.sock,server=on,wait=off",
        "--chardev",
        "socket,id=b,path=/b.sock",
        "--chardev",
        "stdio,id=c",
        "--monitor",
        "chardev=a",
        "--monitor",
        "b",
        "--monitor",
        "chardev=c,mode=control",
    ])
    .unwrap();
    assert_eq!(
        line.process.monitors,
        [
            Chardev::Listen(PathBuf::from("/a.sock")),
            Chardev::Connect(PathBuf::from("/b.sock")),
            Chardev::Stdio,
        ]
    );
    let twice = refusal(&["--chardev", "stdio,id=a", "--chardev", "stdio,id=b"]);
    assert!(twice.contains("cannot use stdio by multiple"), "{twice}");
}

#[test]
fn an_rbd_node_with_cache_direct_on_turns_librbds_cache_off() {
    let graph = |opts: &str| {
        let mut line = parse(&["--blockdev", opts, "--export", EXPORT]).unwrap();
        line.config.disks.remove(0).image
    };
    let direct = graph("rbd,node-name=disk0,pool=p,image=i,cache.direct=on");
    assert_eq!(direct, PathBuf::from("rbd:p/i:rbd_cache=false"));
    // librbd's default (its cache on) is QEMU's for cache.direct=off.
    assert_eq!(
        graph("rbd,node-name=disk0,pool=p,image=i,cache.direct=off"),
        PathBuf::from("rbd:p/i")
    );
    assert!(refusal(&[
        "--blockdev",
        "rbd,node-name=disk0,pool=p,image=i,cache.direct=maybe",
        "--export",
        EXPORT
    ])
    .contains("cache.direct=maybe"));
}

#[test]
fn a_null_node_without_a_size_is_qemus_1_gib() {
    let line = parse(&["--blockdev", "null-co,node-name=disk0", "--export", EXPORT]).unwrap();
    assert_eq!(line.config.disks[0].size, Some(1 << 30));
}

#[test]
fn an_nbd_export_serves_its_bitmaps_in_order_by_name_or_by_node() {
    let line = parse(&[
        "--blockdev",
        "driver=file,node-name=disk0,filename=/x",
        "--nbd-server",
        "addr.type=unix,addr.path=/s",
        "--export",
        "type=nbd,id=e,node-name=disk0,bitmaps.0=b0,bitmaps.1.node=n1,bitmaps.1.name=b1",
    ])
    .unwrap();
    let b = &line.config.nbd_exports[0].bitmaps;
    assert_eq!(
        b,
        &[
            crate::daemon::NbdBitmapSpec::Local("b0".into()),
            crate::daemon::NbdBitmapSpec::External {
                node: "n1".into(),
                name: "b1".into()
            }
        ]
    );
}

#[test]
fn an_nbd_exports_node_and_a_monitors_nodes_choose_the_engine() {
    // NBD exports only: their node's `aio=` is the engine (it once fell back to the pool).
    let nbd_only = |aio: &str| {
        parse(&[
            "--blockdev",
            &format!("driver=file,node-name=f0,filename=/img,aio={aio},cache.direct=on"),
            "--blockdev",
            "driver=qcow2,node-name=q0,file=f0",
            "--nbd-server",
            "addr.type=unix,addr.path=/n.sock",
            "--export",
            "type=nbd,id=e0,node-name=q0",
        ])
        .map(|c| c.config.engine)
    };
    assert_eq!(
        nbd_only("io_uring").unwrap(),
        Choice::Named(EngineKind::Uring)
    );
    assert_eq!(
        nbd_only("native").unwrap(),
        Choice::Named(EngineKind::LinuxAio)
    );
    // An NBD export and a vhost-user-blk one asking for two engines: refused.
    let e = refusal(&[
        "--blockdev",
        "driver=file,node-name=a,filename=/a,aio=io_uring",
        "--blockdev",
        "driver=file,node-name=b,filename=/b,aio=threads",
        "--nbd-server",
        "addr.type=unix,addr.path=/n.sock",
        "--export",
        "type=nbd,id=e0,node-name=a",
        "--export",
        "type=vhost-user-blk,id=e1,node-name=b,addr.type=unix,addr.path=/s.sock",
    ]);
    assert!(e.contains("a second engine"), "{e}");
    // No export yet (a monitor adds them): the nodes' engine if they agree, else the pool.
    let monitor_only = |second: &str| {
        parse(&[
            "--blockdev",
            "driver=file,node-name=a,filename=/a,aio=io_uring",
            "--blockdev",
            &format!("driver=file,node-name=b,filename=/b,aio={second}"),
            "--chardev",
            "socket,id=m0,path=/m.sock,server=on,wait=off",
            "--monitor",
            "chardev=m0",
        ])
        .unwrap()
        .config
        .engine
    };
    assert_eq!(monitor_only("io_uring"), Choice::Named(EngineKind::Uring));
    assert_eq!(monitor_only("native"), Choice::Named(EngineKind::Pool));
}
