"""torch.load of a muon-cpp checkpoint on any PyTorch: from 2.6 on torch.load reads weights only
by default, and the file's typed dictionaries name one more function, restore_type_tag, which
PyTorch's own C++ pickler writes; it is allowed here by name rather than loading unrestricted."""
import torch


def load_checkpoint(path):
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:  # PyTorch < 2.5: no weights-only default to satisfy
        return torch.load(path)
    from torch.jit._pickle import restore_type_tag
    with safe_globals([restore_type_tag]):
        return torch.load(path, weights_only=True)
