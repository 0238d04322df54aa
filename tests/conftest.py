import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")          # tests never reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Test models are tiny: one thread is fastest and avoids OpenMP spin contention on small machines.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No GPU here: the Triton kernels run in Triton's interpreter (float32), so their tests run rather than skip.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
