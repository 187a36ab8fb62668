"""faultfs's fault rules (logfs.testing.faultfs): what a test asks to fail or delay (op, path pattern, errno, the nth
call, a count, a seeded probability), the injector that counts every call against the live rules and keeps the
faults it injected, and the control requests that add, clear and report them (the JSON lines of faultfs's
socket, listed in faultfs's docstring). No FUSE here: the passthrough asks ``Injector.check`` before each call.
"""

from __future__ import annotations

import collections
import errno
import os
import random
import re
import time

OPS = (
    "lookup", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir", "symlink", "rename", "link",
    "open", "create", "read", "write", "flush", "release", "fsync", "opendir", "readdir", "releasedir", "fsyncdir",
    "statfs", "getxattr", "setxattr", "listxattr", "removexattr",
)
ALIASES = {"close": ("flush",), "fdatasync": ("fsync",), "*": OPS, "all": OPS}
LOG_SIZE = 1000  # injected faults kept for "stats"/"injected"


def errno_value(value) -> int:
    """ "EIO", "eio", 5, "5" -> 5."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    number = getattr(errno, text.upper(), None)
    if not isinstance(number, int):
        raise ValueError(f"unknown errno {value!r}")
    return number


def errno_name(number: int) -> str:
    return errno.errorcode.get(number, str(number))


# -- the rules ----------------------------------------------------------------------------------------------
class Rule:
    __slots__ = ("id", "kind", "ops", "pattern", "regex", "errno", "nth", "count", "probability", "seed", "rng",
                 "delay", "seen", "fired", "added")

    def __init__(self, rule_id: int, spec: dict):
        self.id = rule_id
        self.kind = spec.get("kind", "fault")
        if self.kind not in ("fault", "fsyncgate"):
            raise ValueError(f"unknown rule kind {self.kind!r}")
        self.pattern = spec.get("path") or ""
        self.regex = re.compile(self.pattern)
        self.seen = 0
        self.fired = 0
        self.added = time.time()
        self.ops: tuple = ()
        self.errno = 0
        self.delay = 0.0
        self.nth = 1
        self.count = -1
        self.probability = None
        self.seed = None
        self.rng = None
        if self.kind == "fsyncgate":
            return
        op = spec.get("op")
        if not op:
            raise ValueError("a fault rule needs an op")
        names = [op] if isinstance(op, str) else list(op)
        ops: list[str] = []
        for name in names:
            expanded = ALIASES.get(name, (name,))
            for one in expanded:
                if one not in OPS:
                    raise ValueError(f"unknown op {name!r} (known: {', '.join(OPS)}, close, *)")
                if one not in ops:
                    ops.append(one)
        self.ops = tuple(ops)
        if spec.get("errno") is not None:
            self.errno = errno_value(spec["errno"])
        if spec.get("delay_ms") is not None:
            self.delay = float(spec["delay_ms"]) / 1000.0
        if not self.errno and not self.delay:
            self.errno = errno.EIO  # neither given: the default fault
        self.nth = int(spec.get("nth") or 1)
        if self.nth < 1:
            raise ValueError("nth is 1-based")
        self.probability = spec.get("probability")
        if self.probability is not None:
            self.probability = float(self.probability)
            if not 0.0 <= self.probability <= 1.0:
                raise ValueError("probability must be within 0..1")
            self.seed = spec.get("seed")
            self.rng = random.Random(self.seed)
        count = spec.get("count")
        self.count = int(count) if count is not None else (-1 if self.probability is not None else 1)

    def exhausted(self) -> bool:
        return 0 <= self.count <= self.fired

    def describe(self) -> dict:
        out = {"id": self.id, "kind": self.kind, "path": self.pattern, "seen": self.seen, "fired": self.fired}
        if self.kind == "fault":
            out.update(ops=list(self.ops), errno=errno_name(self.errno) if self.errno else None, nth=self.nth,
                       count=self.count, probability=self.probability, seed=self.seed,
                       delay_ms=self.delay * 1000.0 if self.delay else None, exhausted=self.exhausted())
        return out


class Injector:
    """The rules and the counts. Everything runs on the trio thread: no locks."""

    def __init__(self):
        self.rules: dict[int, Rule] = {}
        self.by_op: dict[str, list[Rule]] = {}  # only live (not exhausted) fault rules
        self.gates: list[Rule] = []
        self.calls = dict.fromkeys(OPS, 0)
        self.faults = dict.fromkeys(OPS, 0)
        self.delays = dict.fromkeys(OPS, 0)
        self.log: collections.deque = collections.deque(maxlen=LOG_SIZE)
        self.seq = 0
        self.next_id = 1
        self.power_cut = None  # async () -> dict: set by FaultOperations (a power cut needs its undo records)

    def add(self, spec: dict) -> Rule:
        rule = Rule(self.next_id, spec)
        self.next_id += 1
        self.rules[rule.id] = rule
        if rule.kind == "fsyncgate":
            self.gates.append(rule)
        else:
            for op in rule.ops:
                self.by_op.setdefault(op, []).append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        self.rules.pop(rule.id, None)
        self._unlist(rule)
        if rule in self.gates:
            self.gates.remove(rule)

    def _unlist(self, rule: Rule) -> None:
        for op in rule.ops:
            rules = self.by_op.get(op)
            if rules and rule in rules:
                rules.remove(rule)
                if not rules:
                    del self.by_op[op]

    def gated(self, path: str) -> bool:
        for gate in self.gates:
            if gate.regex.search(path):
                return True
        return False

    def decide(self, op: str, rules: list[Rule], path: str, path2: str | None = None) -> tuple[int, float]:
        """(errno or 0, seconds to sleep first) for one call; counts it in every rule it matches."""
        err = 0
        delay = 0.0
        done = []
        for rule in rules:
            regex = rule.regex
            if not (regex.search(path) or (path2 is not None and regex.search(path2))):
                continue
            rule.seen += 1
            if rule.seen < rule.nth:
                continue
            if rule.rng is not None and rule.rng.random() >= rule.probability:
                continue
            if err and rule.errno:
                continue  # an older rule fails this call already
            rule.fired += 1
            self.seq += 1
            entry = {"seq": self.seq, "rule": rule.id, "op": op, "path": path, "time": time.time()}
            if path2 is not None:
                entry["path2"] = path2
            if rule.delay:
                delay += rule.delay
                entry["delay_ms"] = rule.delay * 1000.0
                self.delays[op] += 1
            if rule.errno:
                err = rule.errno
                entry["errno"] = errno_name(err)
                self.faults[op] += 1
            self.log.append(entry)
            if rule.exhausted():
                done.append(rule)
        for rule in done:
            self._unlist(rule)
        return err, delay

    def _faults(self) -> list[dict]:
        return [e for e in self.log if "errno" in e or "delay_ms" not in e]  # (not the delays)

    # -- the control requests ---------------------------------------------------------------------------
    def request(self, req: dict) -> dict:
        cmd = req.get("cmd", "ping")
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid()}
        if cmd == "add":
            rule = self.add(req)
            return {"ok": True, "id": rule.id}
        if cmd == "clear":
            if req.get("id") is None:
                cleared = list(self.rules.values())
            else:
                rule = self.rules.get(int(req["id"]))
                cleared = [rule] if rule else []
            for rule in cleared:
                self.remove(rule)
            return {"ok": True, "cleared": [rule.id for rule in cleared]}
        if cmd == "stats":
            ops = {op: {"calls": self.calls[op], "faults": self.faults[op], "delays": self.delays[op]}
                   for op in OPS if self.calls[op] or self.faults[op] or self.delays[op]}
            return {"ok": True, "ops": ops, "rules": [rule.describe() for rule in self.rules.values()],
                    "injected": self._faults()[-int(req.get("last", 100)):]}
        if cmd == "injected":
            since = int(req.get("since", 0))
            return {"ok": True, "injected": [e for e in self._faults() if e["seq"] > since]}
        if cmd == "reset_stats":
            for table in (self.calls, self.faults, self.delays):
                for op in table:
                    table[op] = 0
            self.log.clear()
            return {"ok": True}
        raise ValueError(f"unknown cmd {cmd!r}")
