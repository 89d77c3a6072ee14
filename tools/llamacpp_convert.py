"""Run llama.cpp's own converter (convert_hf_to_gguf.py from a llama.cpp checkout) on a checkpoint whose
small byte-level BPE tokenizer llama.cpp does not recognise by hash, telling it the pre-tokenizer is `gpt-2`
(what llama.cpp's docs advise for such vocabularies). Used to check that strata reads llama.cpp's files.

    python tools/llamacpp_convert.py LLAMA_CPP_DIR HF_DIR OUT.gguf [--outtype q8_0] [extra converter args]

LLAMA_CPP_DIR holds convert_hf_to_gguf.py, conversion/ and gguf-py/ (e.g. the llama.cpp tree vendored in the
llama-cpp-python sdist). Nothing of llama.cpp is part of this repository.
"""
import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    root = Path(sys.argv[1]).resolve()
    sys.path[:0] = [str(root / "gguf-py"), str(root)]
    import conversion.base as base  # llama.cpp's
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = [str(root / "convert_hf_to_gguf.py"), sys.argv[2], "--outfile", sys.argv[3], *sys.argv[4:]]
    runpy.run_path(str(root / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
