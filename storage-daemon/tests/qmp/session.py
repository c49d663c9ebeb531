"""A QMP session with QEMU's own client library (qemu.qmp), driven by tests/qmp.rs.

session.py MONITOR SOCKET IMAGE: connects to the daemon's monitor, adds a file block node on
IMAGE (16 MiB) and a vhost-user-blk export of it on SOCKET, says EXPORT-ADDED on stdout, waits
for a line on stdin, "CLIENT-DONE READS WRITES" (the test serves a libblkio client through the
export meanwhile), checks query-blockstats' counts against those, resizes the node to 32 MiB
(block_resize) and checks its virtual size, deletes the export and the node, checks the
BLOCK_EXPORT_DELETED event and that QEMU's error classes come back as qemu.qmp's ExecuteError,
and says SESSION-OK. Any failure raises (exit code 1).
"""
import asyncio
import sys

from qemu.qmp import ExecuteError, QMPClient


async def session(monitor: str, socket: str, image: str) -> None:
    qmp = QMPClient("aio-test")
    await qmp.connect(monitor)
    version = await qmp.execute("query-version")
    assert "qemu" in version, version
    names = {c["name"] for c in await qmp.execute("query-commands")}
    for wanted in ("blockdev-add", "block-export-add", "block-export-del", "blockdev-del",
                   "query-blockstats", "block_resize"):
        assert wanted in names, names
    await qmp.execute("blockdev-add", {"driver": "file", "node-name": "new0",
                                       "filename": image, "cache": {"direct": True}})
    await qmp.execute("block-export-add", {
        "type": "vhost-user-blk", "id": "exp-new", "node-name": "new0",
        "addr": {"type": "unix", "path": socket}, "writable": True})
    exports = await qmp.execute("query-block-exports")
    assert [e["id"] for e in exports if e["id"] == "exp-new"], exports
    with qmp.listener() as listener:
        print("EXPORT-ADDED", flush=True)
        _, reads, writes = sys.stdin.readline().split()
        stats = await qmp.execute("query-blockstats")
        mine = [s["stats"] for s in stats if s["node-name"] == "new0"]
        assert len(mine) == 1, stats
        assert mine[0]["rd_operations"] == int(reads), mine
        assert mine[0]["wr_operations"] == int(writes), mine
        await qmp.execute("block_resize", {"node-name": "new0", "size": 32 << 20})
        nodes = await qmp.execute("query-named-block-nodes")
        sizes = [n["image"]["virtual-size"] for n in nodes if n["node-name"] == "new0"]
        assert sizes == [32 << 20], nodes
        await qmp.execute("block-export-del", {"id": "exp-new"})
        event = await asyncio.wait_for(listener.get(), 10)
    assert event["event"] == "BLOCK_EXPORT_DELETED", event
    assert event["data"]["id"] == "exp-new", event
    await qmp.execute("blockdev-del", {"node-name": "new0"})
    try:
        await qmp.execute("blockdev-del", {"node-name": "new0"})
        raise AssertionError("deleting a deleted node succeeded")
    except ExecuteError as e:
        assert e.error_class == "GenericError", e
    await qmp.disconnect()
    print("SESSION-OK", flush=True)


asyncio.run(session(sys.argv[1], sys.argv[2], sys.argv[3]))
