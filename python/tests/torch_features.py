"""What the interpreter's torch can do, for the tests that need more than every supported torch has
(python/CMakeLists.txt asks the same questions to decide which test files CTest runs):

    python3 python/tests/torch_features.py   # dcp=<0|1> fsdp2=<0|1> torchrun=<0|1> stacks=<0|1>
"""
import torch


def has_dcp_state_dict():
    """torch.distributed.checkpoint.state_dict (get/set_optimizer_state_dict): torch >= 2.2."""
    try:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # noqa: F401
    except ImportError:
        return False
    return True


def has_fsdp2():
    """FSDP2 (torch.distributed.fsdp.fully_shard) and the public DTensor API: torch >= 2.6."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor import DTensor  # noqa: F401
    except ImportError:
        return False
    return True


def torchrun_can_start():
    """torchrun starts ranks here: torch >= 2 (1.13's fails under Python 3.11 before the first
    rank: its Std.from_str returns None) with a TCP store built with libuv, which its rendezvous
    asks for whatever USE_LIBUV says (Debian sid's 2.14 is built without)."""
    if int(torch.__version__.split(".")[0]) < 2:
        return False
    try:
        store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True,
                                           wait_for_workers=False)
    except (RuntimeError, TypeError, ValueError):
        return False
    del store
    return True


def has_stacks():
    """The training stacks test_stacks.py runs muon_cpp in: transformers, lightning (with
    jsonargparse, for its CLI) and accelerate (scripts/pypi_venv.sh installs them beside PyPI's
    torch)."""
    try:
        import accelerate  # noqa: F401
        import jsonargparse  # noqa: F401
        import lightning  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    print(f"dcp={int(has_dcp_state_dict())} fsdp2={int(has_fsdp2())} "
          f"torchrun={int(torchrun_can_start())} stacks={int(has_stacks())}")
