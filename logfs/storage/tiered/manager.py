"""Tiered storage's mechanism (KIP-405's RemoteLogManager): upload, local retention, whole-log retention in the
store, startup reconciliation, and publishing each tiered partition's remote segments to its log.

Driven by the service (``logfs.service.tiering``) from worker threads, one partition at a time
(:meth:`RemoteLogManager.sync`); every call here may block on the store. The store is any
:class:`~logfs.remote.api.RemoteStore`: the engine never imports the S3 client.

Per tiered partition, one pass:

1. load: the manifest from the store (authoritative: one daemon owns a prefix); keys under the partition's
   prefix that it does not name are orphans of a crashed upload or retention, and are deleted (only here, before
   any upload of the partition runs);
2. upload: each sealed, flushed local segment at or past the remote log end offset, in order: its ``.index``,
   ``.timeindex``, ``.viewindex``, ``.txnindex`` (only when Kafka's aborted transactions reach into it: the entries
   of all of them, :mod:`logfs.remote.manifest`) and ``.log`` objects, then its indexes copied to the local cache,
   then the manifest naming it (the commit point), then the log is given the new remote segment;
3. whole-log retention (``retention.ms``/``.bytes`` over the whole log): the manifest without the expired
   segments and with the log start offset advanced first, then their objects deleted;
4. local retention (``local.retention.*``): local segments deleted only once the manifest lists them.

Local state, in each tiered partition's directory, under ``logfs-remote/`` (a subdirectory: Kafka and the loader
look only at the files of a partition directory): each tiered segment's three indexes (and its ``.txnindex``) and
a copy of the last
manifest written or read (so a restart shows the whole log before the store answers), and ``blocks/``, the LRU
cache of fetched ``.log`` ranges (one bound over all partitions). The index and manifest copies are written
durably (temporary, fsync, rename, directory fsync) before anything relies on them, and validated when used: a
copy that fails is never used but fetched again. Cached blocks carry a CRC-32C and are not fsynced: a block a
power cut tore is fetched again.

Offsets may skip: a batch lost unflushed in a power cut just before a roll, or records removed by compaction,
leave a segment starting past the previous one's end. Such a segment is uploaded all the same; the manifest
records each segment's real range, and readers (the view, the Spark source, ``localDataDir``'s seam) read across
the gap. A tiered partition being deleted is first
recorded in ``DATA_DIR/logfs-remote-deletes.json`` (before its directory is renamed), and removed from it only
once its objects are deleted from the store: the deletion survives a crash, and a partition created again under
the same name is not tiered until the old objects are gone.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import replace

from ...remote.api import RemoteCorruptError, RemoteNotFoundError, RemoteStore, RemoteStoreError
from ...remote.manifest import (
    SEGMENT_EXTS, TXN_INDEX_EXT, ManifestStore, PartitionManifest, RemoteFile, RemoteSegment, decode, encode,
    partition_prefix,
)
from ..checkpoints import atomic_write
from ..cleaner.compression import needs_rewrite
from ..errors import CorruptRecordError
from ..local.log import Log
from ..local.open_files import OpenFiles
from ..local.txn_index import encode_txn_index
from ..names import REMOTE_CACHE_DIR, REMOTE_DELETES_FILE
from .block_cache import BlockCache
from .remote_segment import RemoteLogSegment, index_paths, install_index
from ..local.segments import close_if_unused

log = logging.getLogger(__name__)

LOCAL_MANIFEST = "manifest.json"


def tier_stats(plog: Log) -> dict[str, int]:
    """A partition's tiering numbers, as its xattrs name them."""
    with plog.lock:
        local_start = max(plog.segments.first.base_offset, plog.log_start_offset)
        remote = list(plog.remote_segments)
    return {"local_log_start_offset": local_start,
            "remote_log_end_offset": remote[-1].next_offset if remote else 0,
            "remote_segment_count": len(remote), "remote_size_bytes": sum(s.size for s in remote)}


class PartitionTier:
    """The remote state of one partition: the manifest (None until read from the store) and its segments."""

    def __init__(self, plog: Log):
        self.log = plog
        self.manifest: PartitionManifest | None = None  # from the local copy, until ``loaded``
        self.loaded = False  # the store's manifest was read (and orphans deleted) since this daemon started
        self.segments: dict[int, RemoteLogSegment] = {}
        self.lock = threading.Lock()  # one writer of the manifest at a time: a tiering pass, or DeleteRecords
        self.copied_segments = 0  # uploads committed by this daemon (for the metrics)
        self.copied_bytes = 0


class RemoteLogManager:
    def __init__(self, data_dir: str, logs: dict, store: RemoteStore, *, read_store: RemoteStore | None = None,
                 prefix: str = "", cache_bytes: int = 1 << 30, stopping: threading.Event | None = None,
                 open_files: OpenFiles | None = None):
        self.logs = logs  # the LogManager's dict: (topic, partition) -> Log
        self.open_files = open_files if open_files is not None else OpenFiles()  # (the manager's: its segments')
        self.store = store
        self.read_store = read_store or store
        self.manifests = ManifestStore(store, prefix)
        self.prefix = prefix
        self.deletes_path = os.path.join(data_dir, REMOTE_DELETES_FILE)
        self.blocks = BlockCache(cache_bytes)
        self.blocks.wait_base_s = getattr(self.read_store, "read_timeout", self.blocks.wait_base_s)
        for plog in list(logs.values()):
            self.blocks.scan(os.path.join(plog.directory, REMOTE_CACHE_DIR, "blocks"))
        self.tiers: dict[tuple[str, int], PartitionTier] = {}
        self.lock = threading.Lock()
        self.stopping = stopping or threading.Event()  # set when the daemon stops: uploads end between segments

    # -- which partitions ----------------------------------------------------------------------------
    def tiered_logs(self) -> list[Log]:
        return [plog for plog in list(self.logs.values()) if plog.config.remote_storage_enable and not plog.closed]

    @staticmethod
    def _index_dir(plog: Log) -> str:
        return os.path.join(plog.directory, REMOTE_CACHE_DIR)

    def _tier(self, plog: Log) -> PartitionTier:
        with self.lock:
            tier = self.tiers.get((plog.topic, plog.partition))
            if tier is None or tier.log is not plog:
                tier = self.tiers[(plog.topic, plog.partition)] = PartitionTier(plog)
            return tier

    # -- startup -----------------------------------------------------------------------------------
    def attach_cached(self, *, store_reachable: bool = False) -> None:
        """At startup, before the mount serves anything: publish every tiered partition's remote segments from the
        local copy of its manifest and of their indexes (written durably), so the mount shows the whole log at
        once, whatever crash came before (reads of tiered ranges need the store, the view does not). A copy that
        fails validation is never used: with ``store_reachable`` (the store answered the check at mount) the
        partition's state is read from the store instead; otherwise it waits for the first tiering pass, and the
        log says so."""
        for plog in self.tiered_logs():
            path = os.path.join(self._index_dir(plog), LOCAL_MANIFEST)
            tier = self._tier(plog)
            try:  # temporaries of installs a crash interrupted
                for name in os.listdir(self._index_dir(plog)):
                    if ".tmp-" in name:
                        os.unlink(os.path.join(self._index_dir(plog), name))
            except FileNotFoundError:
                pass
            try:
                with open(path, "rb") as f:
                    m = decode(f.read(), path)
                if (m.topic, m.partition) != (plog.topic, plog.partition):
                    raise RemoteCorruptError(f"{path}: names {m.topic}-{m.partition}")
                self._publish(tier, m, fetch=False)
                continue
            except FileNotFoundError as exc:
                if not os.path.isdir(os.path.dirname(path)):
                    continue  # nothing was ever tiered from this partition
                problem = exc  # its directory is there: the copy was lost
            except (OSError, RemoteStoreError) as exc:
                problem = exc
            if store_reachable:
                try:
                    self.load(tier)
                    log.warning("%s-%d: local tiered state unusable (%s); read again from the store", plog.topic,
                                plog.partition, problem)
                    continue
                except (OSError, RemoteStoreError) as exc:
                    problem = f"{problem}; and from the store: {exc}"
            log.error("%s-%d: local tiered state unusable (%s): the mount shows the tiered part of this log once "
                      "the store answers", plog.topic, plog.partition, problem)

    def load(self, tier: PartitionTier) -> None:
        """Read the manifest from the store, delete orphans, publish. Raises RemoteStoreError (retried later)."""
        plog = tier.log
        m = self.manifests.read(plog.topic, plog.partition)
        orphans = self.manifests.orphans(m)
        if orphans:
            log.info("%s-%d: deleting %d orphan object(s) of an interrupted upload or retention", plog.topic,
                     plog.partition, len(orphans))
            self.store.delete(orphans)
        self._publish(tier, m, fetch=True)
        tier.loaded = True

    def _publish(self, tier: PartitionTier, m: PartitionManifest, *, fetch: bool) -> None:
        """Make ``m`` the partition's remote state: open its segments (indexes fetched if missing and ``fetch``),
        give them to the log with the whole log's start offset, and keep a local copy of ``m``."""
        plog = tier.log
        index_dir = self._index_dir(plog)
        opened: dict[int, RemoteLogSegment] = {}
        for meta in m.segments:
            seg = tier.segments.get(meta.base_offset)
            if seg is None or seg.meta != meta or seg.broken:
                seg = self._open_remote(index_dir, meta, fetch, refetch=seg is not None and seg.broken)
                if seg.aborted is not None and plog.config.read_uncommitted:
                    self._measure_aborted(seg)
            opened[meta.base_offset] = seg
        ordered = [opened[meta.base_offset] for meta in m.segments]
        for seg, after in zip(ordered, ordered[1:] + [None]):
            seg.successor = after  # where a forward reader's read-ahead goes on at the segment's end
        install_index(os.path.join(index_dir, LOCAL_MANIFEST), data=encode(m))
        with plog.lock:
            if m.segments:
                # The manifest is the whole log's start. Offsets may skip between the tiered and the local part
                # (a batch lost in a power cut, compaction): that is a gap in offsets, never a reason to hide the
                # tiered part. Local segments are deleted only once a durable manifest lists them.
                start = m.log_start_offset
            else:
                start = max(m.log_start_offset, plog.log_start_offset, plog.segments.first.base_offset)
            plog.set_remote([opened[s.base_offset] for s in m.segments], start)
        tier.manifest = m
        # Segments dropped here are not closed: a handle's snapshot may still read them (their mappings go with
        # the last reference).
        tier.segments = opened

    @staticmethod
    def _measure_aborted(seg: RemoteLogSegment) -> None:
        """Count the lines of the aborted batches of a tiered segment of a ``read_uncommitted`` topic here, in the
        pass's (or the startup's) thread, not when a view first reads it. It reads the whole ``.log`` through the
        block cache: a store that fails leaves it to the view (which then measures it, once), and says so."""
        try:
            seg.measure_aborted()
        except (OSError, RemoteStoreError, CorruptRecordError) as exc:
            log.warning("%s: its aborted transactions' batches not measured yet (%s)", seg.key, exc)

    def _open_remote(self, index_dir: str, meta: RemoteSegment, fetch: bool, refetch: bool = False
                     ) -> RemoteLogSegment:
        """A tiered segment over its local index copies (its ``.txnindex`` among them when it has one). Copies that
        are missing, of the wrong size, or fail the segment's checks are fetched from the store again when
        ``fetch`` (else RemoteStoreError): a copy that fails validation is never used."""
        paths = index_paths(index_dir, meta.base_offset, meta.objects)
        for attempt in range(2):
            for ext, path in paths.items():
                stale = (refetch or attempt > 0 or not os.path.exists(path)
                         or os.path.getsize(path) != meta.objects[ext].size)
                if stale:
                    if not fetch:
                        raise RemoteNotFoundError(f"{path} is not cached")
                    install_index(path, data=self.store.get_bytes(meta.objects[ext].key))
            try:
                return RemoteLogSegment(meta, index_dir, self.read_store, self.blocks, self.open_files)
            except RemoteCorruptError as exc:
                if not fetch or attempt:
                    raise
                log.warning("%s; fetching the indexes of segment %d again", exc, meta.base_offset)
        raise AssertionError("unreachable")

    # -- one pass ----------------------------------------------------------------------------------
    def sync(self, plog: Log, now_ms: int) -> int:
        """One pass over a tiered partition: load (once), upload, whole-log then local retention. Returns the
        number of segments uploaded. Raises RemoteStoreError or OSError for the service to back off."""
        if (plog.topic, plog.partition) in self._pending_deletes():
            return 0  # the objects of an earlier partition of that name go first
        tier = self._tier(plog)
        with tier.lock:
            if not tier.loaded:
                self.load(tier)  # the store's manifest is the authority (the local copy may be one upload behind)
            elif any(seg.broken for seg in tier.segments.values()):
                self._publish(tier, tier.manifest, fetch=True)  # index copies that failed their check: fetched again
            uploaded = self.upload(tier)
            if not self.stopping.is_set():  # (see _upload_one)
                self.expire(tier, now_ms)
            if not self.stopping.is_set():
                self.local_retention(tier, now_ms)
            return uploaded

    def delete_records(self, plog: Log, offset: int) -> None:
        """DeleteRecords on a tiered partition: the manifest, the whole log's start, says ``offset`` before the
        log does (written to the store, the commit point, then the local copy, then published to the log), so no
        restart or follower brings the records back. Tiered segments wholly below it go at the next pass, by
        whole-log retention (:meth:`expire`). Raises RemoteStoreError if the store cannot take the manifest."""
        tier = self._tier(plog)
        with tier.lock:
            if not tier.loaded:
                self.load(tier)
            m = tier.manifest
            if m.log_start_offset >= offset:
                return
            new = replace(m, generation=m.generation + 1, log_start_offset=offset)
            self.manifests.write(new)
            self._publish(tier, new, fetch=False)

    def upload(self, tier: PartitionTier) -> int:
        plog = tier.log
        count = 0
        if plog.recovery_point < plog.active_segment.base_offset:
            plog.flush(plog.active_segment.base_offset)  # a segment is uploaded only once durable locally
        with plog.snapshot(sealed_only=True) as snap:
            for seg in snap.segments:
                m = tier.manifest
                end = m.remote_log_end_offset if m.segments else m.log_start_offset
                if seg.next_offset <= end:
                    continue  # tiered already (the manifest decides: never uploaded twice), or expired
                if seg.deleted or seg.next_offset > plog.recovery_point or plog.closed or self.stopping.is_set():
                    break  # not flushed yet (or going away): later, in order
                if seg.size == 0 or seg.next_offset <= seg.base_offset:
                    continue  # no records (a power cut took all of a rolled segment's): nothing to tier
                if needs_rewrite(seg, plog.config):
                    break  # the bucket gets it compressed: after its rewrite (logfs.storage.cleaner.compression)
                if m.segments and seg.base_offset < end:
                    # Cannot happen (a tiered segment is flushed, so no later load changes its range): refuse
                    # rather than tier an offset twice, and say so.
                    log.error("%s-%d: segment %d..%d overlaps the tiered log, which ends at %d; not uploaded",
                              plog.topic, plog.partition, seg.base_offset, seg.next_offset, end)
                    break
                # A segment past the remote log end (offsets lost with unsynced records, or removed by
                # compaction) is uploaded: the manifest records each segment's real range, gaps included.
                self._upload_one(tier, seg)
                count += 1
        return count

    def _upload_one(self, tier: PartitionTier, seg) -> None:
        plog = tier.log
        keys = self.manifests.segment_keys(plog.topic, plog.partition, seg.base_offset)
        indexes = {"index": seg.offset_index, "timeindex": seg.time_index, "viewindex": seg.view_index}
        kinds = SEGMENT_EXTS
        # An index object is exactly its entries, whatever the file's size (never a preallocated tail), and the
        # view index must end with its end entry: a reader of the bucket relies on both.
        end = seg.view_index.last()
        if end is None or end.position != seg.size:
            raise OSError(f"{seg.log_path}: its view index has no end entry; not uploaded")
        min_timestamp = self._min_timestamp(seg)
        contents = {}
        for ext, index in indexes.items():
            with open(index.path, "rb") as f:
                contents[ext] = f.read(index.entries * index.entry_size)
            if len(contents[ext]) != index.entries * index.entry_size:
                raise OSError(f"{index.path}: shorter than its {index.entries} entries; not uploaded")
        if seg.aborted:
            # Kafka's aborted transactions reaching into it, those whose markers lie in later segments too (the
            # loader gave it every one, from all of the partition's .txnindex files): a reader of this segment
            # alone skips their batches. Before the .log, so the .log's presence still ends an upload.
            contents[TXN_INDEX_EXT] = encode_txn_index(seg.aborted.txns(seg.base_offset, seg.next_offset))
            kinds = SEGMENT_EXTS[:-1] + (TXN_INDEX_EXT,) + SEGMENT_EXTS[-1:]
        objects = {}
        for ext in kinds:
            if ext == "log":
                size = self.store.put_file(keys[ext], f"/proc/self/fd/{seg.fd}")
            else:
                self.store.put_bytes(keys[ext], contents[ext])
                size = len(contents[ext])
            objects[ext] = RemoteFile(keys[ext], size)
            if self.stopping.is_set():
                # The daemon stopped without waiting for this thread (a store call can take its whole time
                # bound): commit nothing. The objects are orphans, deleted at the next start.
                return
        if objects["log"].size != seg.size:
            raise OSError(f"{seg.log_path}: uploaded {objects['log'].size} bytes of {seg.size}")
        meta = RemoteSegment(seg.base_offset, seg.next_offset, seg.size, seg.max_timestamp, objects, min_timestamp)
        paths = index_paths(self._index_dir(plog), seg.base_offset, objects)
        for ext, path in paths.items():
            install_index(path, data=contents[ext])
        new = tier.manifest.with_segment(meta)
        self.manifests.write(new)  # the commit point: from here the segment is tiered
        tier.copied_segments += 1
        tier.copied_bytes += seg.size
        log.debug("%s-%d: segment %d..%d tiered", plog.topic, plog.partition, seg.base_offset, seg.next_offset)
        self._publish(tier, new, fetch=True)

    @staticmethod
    def _min_timestamp(seg) -> int:
        """The sealed segment's smallest record timestamp, for its manifest entry: a read of the whole ``.log``
        walking every record's timestamp (Kafka's indexes hold only the largest so far), here in the upload's
        worker thread, just before the same bytes are uploaded (ARCHITECTURE.md, "Tiered storage", gives its
        cost). A batch whose records cannot be walked gives -1 (unknown: readers then never skip the segment on
        an upper time bound) and a warning, not a failed upload; a failed read fails the pass, as the put would."""
        try:
            return seg.min_timestamp()
        except CorruptRecordError as exc:
            log.warning("%s: no min_timestamp for its manifest entry (%s)", seg.log_path, exc)
            return -1

    # -- retention ---------------------------------------------------------------------------------
    def expire(self, tier: PartitionTier, now_ms: int) -> int:
        """Whole-log retention over the tiered segments: manifest first, then the objects."""
        plog, m = tier.log, tier.manifest
        if not m.segments:
            return 0
        c = plog.config
        with plog.lock:
            local_first = plog.segments.first.base_offset
            start = plog.log_start_offset
            local_size = plog.size_bytes
        below = [s for s in m.segments if s.next_offset <= local_first]
        excess = -1
        if c.delete and c.retention_bytes >= 0:
            excess = local_size + sum(s.size for s in below) - c.retention_bytes
        cut = None
        for s in m.segments:
            breach = s.next_offset <= start
            if not breach and c.delete:
                if excess >= 0 and excess - s.size >= 0 and s in below:
                    breach = True
                elif c.retention_ms >= 0 and s.max_timestamp >= 0 and now_ms - s.max_timestamp > c.retention_ms:
                    breach = True
            if not breach:
                break
            if excess >= 0 and s in below:
                excess -= s.size
            cut = s.next_offset
        if cut is None:
            return 0
        new, dropped = m.without_segments_below(cut)
        self.manifests.write(new)
        before = tier.segments
        self._publish(tier, new, fetch=True)
        with plog.lock:  # a snapshot pinning a dropped segment goes on reading its indexes, mapped before they go
            for seg in (before.get(s.base_offset) for s in dropped):
                if seg is not None:
                    if seg.refs > 0:
                        seg.hold_files()
                    seg.deleted = seg.purged = True
                    close_if_unused(seg)
        self.store.delete([k for s in dropped for k in s.keys()])
        index_dir = self._index_dir(plog)
        for s in dropped:
            self.blocks.drop(os.path.join(index_dir, "blocks"), s.objects["log"].key)
            for path in index_paths(index_dir, s.base_offset, s.objects).values():
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        log.info("%s-%d: retention deleted %d tiered segment(s); log start offset now %d", plog.topic,
                 plog.partition, len(dropped), new.log_start_offset)
        return len(dropped)

    def local_retention(self, tier: PartitionTier, now_ms: int) -> int:
        """Delete local segments past ``local.retention.*``, but only those the manifest lists."""
        plog = tier.log
        end = tier.manifest.remote_log_end_offset if tier.manifest.segments else -1
        c = plog.config
        limit_bytes, limit_ms = c.effective_local_retention_bytes, c.effective_local_retention_ms
        with plog.lock:
            if plog.closed or self.stopping.is_set():
                return 0
            sealed = plog.segments.as_list()[:-1]
            excess = plog.size_bytes - limit_bytes if limit_bytes >= 0 else -1
            victims = []
            for s in sealed:
                breach = s.next_offset <= plog.log_start_offset  # below the whole log's start: gone anyway
                if not breach and s.next_offset > end:
                    break  # not tiered yet: it waits for its upload
                breach = (breach or (excess >= 0 and excess - s.size >= 0)
                          or (limit_ms >= 0 and now_ms - s.largest_timestamp > limit_ms))
                if not breach:
                    break
                if excess >= 0:
                    excess -= s.size
                victims.append(s)
            if victims:
                plog.delete_segments(victims, tiered=True)
        return len(victims)

    # -- deleted partitions ------------------------------------------------------------------------
    def _pending_deletes(self) -> set[tuple[str, int]]:
        try:
            with open(self.deletes_path, encoding="utf-8") as f:
                return {(str(t), int(p)) for t, p in json.load(f)}
        except FileNotFoundError:
            return set()
        except (ValueError, TypeError) as exc:
            log.error("%s is corrupt (%s); remote objects of deleted partitions may remain", self.deletes_path, exc)
            return set()

    def _write_deletes(self, pending: set[tuple[str, int]]) -> None:
        atomic_write(self.deletes_path, json.dumps(sorted(pending)).encode())

    def schedule_delete(self, topic: str, partition: int) -> None:
        """Record, durably, that a tiered partition is being deleted (before its directory goes away)."""
        with self.lock:
            self._write_deletes(self._pending_deletes() | {(topic, partition)})

    def purge_deleted(self) -> int:
        """Delete the objects of the partitions recorded as deleted, then their record. Returns how many."""
        done = 0
        for topic, partition in sorted(self._pending_deletes()):
            objects = self.store.list(partition_prefix(self.prefix, topic, partition))
            self.store.delete([o.key for o in objects])
            with self.lock:
                self._write_deletes(self._pending_deletes() - {(topic, partition)})
                tier = self.tiers.get((topic, partition))
                if tier is not None and tier.log.closed:
                    del self.tiers[(topic, partition)]
            log.info("%s-%d: the deleted partition's %d remote object(s) removed", topic, partition, len(objects))
            done += 1
        return done

    # -- followers -----------------------------------------------------------------------------------
    def apply_manifest(self, plog: Log, m: PartitionManifest) -> None:
        """Make ``m``, read from the store, the partition's remote state (a follower applying its writer's)."""
        tier = self._tier(plog)
        tier.loaded = True
        self._publish(tier, m, fetch=True)

    def shown_manifests(self) -> dict[tuple[str, int], PartitionManifest]:
        """The manifest each partition of the mount shows (those with one)."""
        with self.lock:
            tiers = list(self.tiers.items())
        return {key: tier.manifest for key, tier in tiers if tier.manifest is not None
                and self.logs.get(key) is tier.log and not tier.log.closed}

    def close(self) -> None:
        self.blocks.close()
        for tier in list(self.tiers.values()):
            for seg in tier.segments.values():
                seg.close()
