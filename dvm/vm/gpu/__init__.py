"""The GPU VM: the same verified Programs on NVIDIA GPUs, through one Triton kernel compiled once.

Layout: abi.py (constants shared by host and kernels), image.py (a verified Program as the device
image the kernel reads), interp.py (the kernel: state machine and decode), execute.py (instruction
handlers), tiles.py (addressing, typed memory, reduction trees, register file), ops.py and
mathf.py (op semantics), memory.py (device memory providers), vm.py (the VM contract: bind, run).
"""
from .vm import GpuVM

VM_INSTANCE = GpuVM()
