"""What bench/hf_baseline.py and bench/hf_decode.py share: the device, dtype and thread
arguments, loading the model with them, and the fields that say what ran."""


def add_model_args(ap):
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, f32 on cpu), bfloat16, float16, float32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")


def load_model(a):
    """The model of directory `a.model` on `a.device` in `a.dtype`, in eval mode.

    Returns (torch, model, device, fields) where `fields` describes the run for the
    JSON line (engine, versions, device, dtype, threads)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype_name = a.dtype
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device == "cuda" else "float32"
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, dtype_name)).to(device).eval()
    fields = {
        "engine": "hf-transformers",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "dtype": dtype_name,
        "threads": torch.get_num_threads(),
    }
    return torch, model, device, fields
