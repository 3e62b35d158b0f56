"""A CPU without AVX-512, simulated in every Python process of a test run (the suite's own, vLLM's
EngineCore and workers, the CLI's children): put this folder on PYTHONPATH and set
PATCHKIT_SIMULATE_NO_AVX512=1 (`.ci/run` does so for its second leg).

On such a CPU (an AMD EPYC with AVX2 only, seen by a new user) vLLM's CPU platform loads its AVX2 build of the
native ops (`vllm._C_AVX2`), and importing `vllm._C` (the AVX-512 build; `vllm.platforms.rocm` and other
platforms' modules import it unconditionally) is an illegal instruction: the process dies with no exception.
Here: torch reports no AVX-512, so vLLM's CPU platform takes the AVX2 build as it would there, and an import of
`vllm._C`, `vllm._C_AVX512` or `vllm._rocm_C` aborts the process (SIGABRT) after one line on stderr.
"""

import os
import sys

if os.environ.get("PATCHKIT_SIMULATE_NO_AVX512") == "1":
    import importlib.abc
    import importlib.machinery

    _DEADLY = frozenset({"vllm._C", "vllm._C_AVX512", "vllm._rocm_C"})

    class _NoAvx512Torch:
        """Loader of `torch.cpu` that reports no AVX-512 once the module ran."""

        def __init__(self, real):
            self.real = real

        def create_module(self, spec):
            return self.real.create_module(spec)

        def exec_module(self, module):
            self.real.exec_module(module)
            module._is_avx512_supported = lambda: False
            module._is_avx512_bf16_supported = lambda: False

    class _SimulatedCpu(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in _DEADLY:
                sys.stderr.write(f"simulated CPU without AVX-512: importing {name} is an illegal instruction\n")
                sys.stderr.flush()
                os.abort()
            if name == "torch.cpu":
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is not None and spec.loader is not None:
                    spec.loader = _NoAvx512Torch(spec.loader)
                return spec
            return None

    sys.meta_path.insert(0, _SimulatedCpu())
