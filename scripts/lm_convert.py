"""One packaged real LM: its GGUF (chunks joined) dequantized into a float32 model folder."""

import sys
import tempfile
from pathlib import Path

from selfrepair.core import packaged_lms, runtime

smk = snakemake  # noqa: F821
runtime.start(smk)
name = smk.wildcards.lm
p = packaged_lms.PACKAGED[name]
source = {"name": name, "package": p["package"], "version": packaged_lms.installed_version(name)}
parts = packaged_lms.gguf_parts(name)
with tempfile.TemporaryDirectory(dir=Path(smk.output.folder).parent) as tmp:
    gguf = parts[0] if len(parts) == 1 else packaged_lms.assemble(name, Path(tmp) / f"{name}.gguf")
    record = packaged_lms.convert(gguf, smk.output.folder, source)
print(record, file=sys.stderr)
