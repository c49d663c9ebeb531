"""A QMP session with QEMU's own client library (qemu.qmp), driven by tests/qmp.rs.

session.py MONITOR SOCKET: connects to the daemon's monitor, adds a null block node and a
vhost-user-blk export of it on SOCKET, says EXPORT-ADDED on stdout, waits for a line on stdin
(the test serves a libblkio client through the export meanwhile), deletes the export and the
node, checks the BLOCK_EXPORT_DELETED event and that QEMU's error classes come back as
qemu.qmp's ExecuteError, and says SESSION-OK. Any failure raises (exit code 1).
"""
import asyncio
import sys

from qemu.qmp import ExecuteError, QMPClient


async def session(monitor: str, socket: str) -> None:
    qmp = QMPClient("aio-test")
    await qmp.connect(monitor)
    version = await qmp.execute("query-version")
    assert "qemu" in version, version
    names = {c["name"] for c in await qmp.execute("query-commands")}
    for wanted in ("blockdev-add", "block-export-add", "block-export-del", "blockdev-del"):
        assert wanted in names, names
    await qmp.execute("blockdev-add", {"driver": "null-co", "node-name": "null0",
                                       "size": 16 << 20, "read-zeroes": True})
    await qmp.execute("block-export-add", {
        "type": "vhost-user-blk", "id": "exp-null", "node-name": "null0",
        "addr": {"type": "unix", "path": socket}, "writable": True})
    exports = await qmp.execute("query-block-exports")
    assert [e["id"] for e in exports if e["id"] == "exp-null"], exports
    with qmp.listener() as listener:
        print("EXPORT-ADDED", flush=True)
        sys.stdin.readline()
        await qmp.execute("block-export-del", {"id": "exp-null"})
        event = await asyncio.wait_for(listener.get(), 10)
    assert event["event"] == "BLOCK_EXPORT_DELETED", event
    assert event["data"]["id"] == "exp-null", event
    await qmp.execute("blockdev-del", {"node-name": "null0"})
    try:
        await qmp.execute("blockdev-del", {"node-name": "null0"})
        raise AssertionError("deleting a deleted node succeeded")
    except ExecuteError as e:
        assert e.error_class == "GenericError", e
    await qmp.disconnect()
    print("SESSION-OK", flush=True)


asyncio.run(session(sys.argv[1], sys.argv[2]))
