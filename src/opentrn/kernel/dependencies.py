"""The dependencies between instructions: the accesses of past instructions, per
allocation and engine, from which :class:`~opentrn.kernel.Kernel` finds the semaphore waits
an instruction needs."""

from opentrn import isa

# A region is (key, rect): key names an allocation ("hbm"|"sbuf"|"psum", index), rect is
# (a0, a1, b0, b1): rows/partitions a0..a1-1 x absolute bytes b0..b1-1 of that space.


def _overlap(r, s):
    return r[0] < s[1] and s[0] < r[1] and r[2] < s[3] and s[2] < r[3]


def _inside(r, s):
    """Rect ``r`` inside rect ``s``."""
    return s[0] <= r[0] and r[1] <= s[1] and s[2] <= r[2] and r[3] <= s[3]


class _Tracker:
    """The accesses of past instructions, per allocation and engine, pruned of the ones a
    later access of the same engine makes redundant (a newer access over the same region
    that conflicts with everything the older one conflicts with)."""

    def __init__(self):
        self.records = {}          # key -> [list per engine of (idx, write, rect)]
        self.graves = {"sbuf": [], "psum": []}    # freed: (b0, b1, records)

    def new_key(self, key, span):
        """Start tracking allocation ``key`` over the byte span ``(b0, b1)``, inheriting the
        accesses of freed allocations that shared its bytes (WAR / WAW across reuse)."""
        lists = [[] for _ in isa.Engine]
        graves = self.graves.get(key[0], [])
        keep = []
        for b0, b1, records in graves:
            if b0 < span[1] and span[0] < b1:
                for engine, recs in enumerate(records):
                    lists[engine] += recs
                if not (span[0] <= b0 and b1 <= span[1]):
                    keep.append((b0, b1, records))
            else:
                keep.append((b0, b1, records))
        if key[0] in self.graves:
            self.graves[key[0]] = keep
        self.records[key] = lists

    def retire(self, key, span):
        self.graves[key[0]].append((span[0], span[1], self.records.pop(key)))

    def needs(self, engine, accesses):
        """``{engine f: value}``: waits ``sem[f] >= value`` the accesses require."""
        need = {}
        for key, write, rect in accesses:
            lists = self.records[key]
            for f in isa.Engine:
                if f == engine and not (f == isa.Engine.ACTIVATION and key[0] == "sbuf"):
                    continue
                for idx, rec_write, rec_rect in lists[f]:
                    if (write or rec_write) and idx + 1 > need.get(f, 0) and _overlap(
                            rect, rec_rect):
                        need[f] = idx + 1
        return need

    def add(self, engine, idx, accesses):
        for key, write, rect in accesses:
            recs = self.records[key][engine]
            recs[:] = [r for r in recs if not (_inside(r[2], rect) and (write or not r[1]))]
            recs.append((idx, write, rect))
