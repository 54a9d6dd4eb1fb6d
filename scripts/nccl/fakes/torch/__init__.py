"""A stand-in for torch, for the tests of scripts/nccl-check only (scripts/nccl/test_nccl_check.py).

Just what scripts/nccl/worker.py and the pre-flight probe touch: 1-D integer tensors on plain
Python lists (views share storage, so buf[a:b].copy_(x) writes through), torch.cuda with one
fake GPU and a fake NCCL version, and torch.distributed (fakes/torch/distributed/) whose
collectives exchange buffers through files and which writes NCCL-shaped INFO logs and probes
files. It lets the whole runner run end to end on a machine without a GPU, and inject faults.

FAKE_TORCH=no-gpu makes torch.cuda.is_available() false.
"""

import os
import types

__version__ = "0.0+fake"
version = types.SimpleNamespace(cuda="13.0")


class dtype:
    def __init__(self, name, bits, signed):
        self.name, self.bits, self.signed = name, bits, signed

    def wrap(self, v):
        v = int(v)
        if self.name == "bool":
            return bool(v)
        if self.bits >= 64:
            return v
        v &= (1 << self.bits) - 1
        if self.signed and v >= 1 << (self.bits - 1):
            v -= 1 << self.bits
        return v

    def __repr__(self):
        return f"torch.{self.name}"


int64 = dtype("int64", 64, True)
int32 = dtype("int32", 32, True)
uint8 = dtype("uint8", 8, False)
bool_ = dtype("bool", 1, False)
float64 = dtype("float64", 64, True)


class device:
    def __init__(self, type, index=None):
        if isinstance(type, str) and ":" in type:
            type, index = type.split(":")
        self.type, self.index = type, None if index is None else int(index)

    def __repr__(self):
        return f"device(type='{self.type}', index={self.index})"


class Tensor:
    def __init__(self, storage, dtype=int64, offset=0, length=None, dev=None):
        self._s, self.dtype, self._o = storage, dtype, offset
        self._n = len(storage) - offset if length is None else length
        self.device = dev or device("cuda", 0)

    # -- shape and access
    def numel(self):
        return self._n

    def __len__(self):
        return self._n

    def tolist(self):
        return self._s[self._o:self._o + self._n]

    def _vals(self):
        return self._s[self._o:self._o + self._n]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self._n)
            if step != 1:
                raise NotImplementedError("step slices")
            return Tensor(self._s, self.dtype, self._o + start, max(0, stop - start), self.device)
        if isinstance(key, Tensor):
            vals = self._vals()
            return Tensor([vals[int(i)] for i in key.tolist()], self.dtype, dev=self.device)
        vals = self._vals()
        return Tensor([vals[key]], self.dtype, dev=self.device)

    def item(self):
        if self._n != 1:
            raise ValueError("item() of a tensor with %d elements" % self._n)
        return self._s[self._o]

    def copy_(self, other):
        vals = other.tolist() if isinstance(other, Tensor) else list(other)
        if len(vals) != self._n:
            raise ValueError("copy_ of %d elements into %d" % (len(vals), self._n))
        self._s[self._o:self._o + self._n] = [self.dtype.wrap(v) for v in vals]
        return self

    def to(self, what):
        if isinstance(what, dtype):
            return Tensor([what.wrap(v) for v in self._vals()], what, dev=self.device)
        return Tensor(self.tolist(), self.dtype, dev=device(what) if isinstance(what, str) else what)

    def cpu(self):
        return self.to("cpu")

    def sum(self):
        return Tensor([sum(int(v) for v in self._vals())], int64, dev=self.device)

    def nonzero(self):
        return Tensor([i for i, v in enumerate(self._vals()) if v], int64, dev=self.device)

    def flatten(self):
        return self

    # -- elementwise arithmetic (int64 semantics; inputs here never overflow)
    def _bin(self, other, fn, out=None):
        a = self._vals()
        if isinstance(other, Tensor):
            b = other._vals()
            if len(b) != len(a):
                raise ValueError("shape mismatch %d vs %d" % (len(a), len(b)))
            vals = [fn(int(x), int(y)) for x, y in zip(a, b)]
        else:
            o = int(other)
            vals = [fn(int(x), o) for x in a]
        dt = out or int64
        return Tensor([dt.wrap(v) for v in vals], dt, dev=self.device)

    def __add__(self, o):
        return self._bin(o, lambda x, y: x + y)

    __radd__ = __add__

    def __sub__(self, o):
        return self._bin(o, lambda x, y: x - y)

    def __mul__(self, o):
        return self._bin(o, lambda x, y: x * y)

    __rmul__ = __mul__

    def __and__(self, o):
        return self._bin(o, lambda x, y: x & y)

    def __xor__(self, o):
        return self._bin(o, lambda x, y: x ^ y)

    def __rshift__(self, o):
        return self._bin(o, lambda x, y: x >> y)

    def __floordiv__(self, o):
        return self._bin(o, lambda x, y: x // y)

    def __mod__(self, o):
        return self._bin(o, lambda x, y: x % y)

    def __ne__(self, o):
        return self._bin(o, lambda x, y: int(x != y), bool_)

    def __eq__(self, o):
        return self._bin(o, lambda x, y: int(x == y), bool_)

    __hash__ = object.__hash__

    def __repr__(self):
        return f"tensor({self.tolist()[:8]}..., dtype={self.dtype})"


def _dev(d):
    return d if isinstance(d, device) else device(d or "cuda:0")


def empty(n, dtype=int64, device=None):
    return Tensor([0] * int(n), dtype, dev=_dev(device))


def zeros(n, dtype=int64, device=None):
    return empty(n, dtype, device)


def arange(start, stop=None, dtype=int64, device=None):
    if stop is None:
        start, stop = 0, start
    return Tensor(list(range(int(start), int(stop))), dtype, dev=_dev(device))


def tensor(values, dtype=int64, device=None):
    return Tensor([dtype.wrap(v) for v in values], dtype, dev=_dev(device))


class _Nccl:
    @staticmethod
    def version():
        return (2, 28, 9)


class _Cuda:
    nccl = _Nccl()

    @staticmethod
    def is_available():
        return os.environ.get("FAKE_TORCH") != "no-gpu"

    @staticmethod
    def device_count():
        return 1 if _Cuda.is_available() else 0

    @staticmethod
    def set_device(d):
        pass

    @staticmethod
    def synchronize(d=None):
        pass

    @staticmethod
    def get_device_name(d=None):
        return "Fake GPU (scripts/nccl/fakes)"


cuda = _Cuda()
