"""One GGUF dequantized into a float32 model folder: a packaged real LM (its chunks joined,
its SHA-256 checked) or a user's own .gguf file (wildcard lm: its file_key)."""

import sys
import tempfile
from pathlib import Path

from selfrepair.core import gguf_files, packaged_lms, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
name, user_file = smk.wildcards.lm, smk.params.file
with tempfile.TemporaryDirectory(dir=Path(smk.output.folder).parent) as tmp:
    if user_file:
        if gguf_files.file_key(user_file) != name:
            raise gguf_files.BadGGUF(f"{user_file} changed since the workflow started (no longer {name}): rerun")
        gguf, source = user_file, {"name": name, "file": str(Path(user_file).resolve())}
    else:
        gguf, source = packaged_lms.packaged_gguf(name, tmp), packaged_lms.source(name)
    record = gguf_files.convert(gguf, smk.output.folder, source)
print(record, file=sys.stderr)
