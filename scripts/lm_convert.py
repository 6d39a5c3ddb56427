"""One GGUF dequantized into a float32 model folder: a packaged real LM (its chunks joined,
its SHA-256 checked) or a user's own .gguf file (wildcard lm: its file_key)."""

import sys
from pathlib import Path

from selfrepair.core import gguf_files, packaged_lms, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
name, user_file = smk.wildcards.lm, smk.params.file
with gguf_files.scratch(Path(smk.output.folder).parent) as tmp:  # a killed run's leftover removed first
    if user_file:
        gguf_files.check_user_file(user_file, name)
        # the file, and the path it was named by (a link's own): found by either once it is gone
        gguf, source = (
            user_file,
            {"name": name, "file": str(Path(user_file).resolve()), "path": str(Path(user_file).absolute())},
        )
    else:
        gguf, source = packaged_lms.packaged_gguf(name, tmp), packaged_lms.source(name)
    record = gguf_files.convert(gguf, smk.output.folder, source)
print(record, file=sys.stderr)
