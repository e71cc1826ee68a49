"""Only the optional C extensions; everything else is in pyproject.toml.

`spanrl.collector._wire` (collector/_wire.c, wire_*.c, wire.h; plain CPython C API) is the collector's OTLP
protobuf fast path; `spanrl.instrumentation._encode` (instrumentation/_encode.c) the agent's span encoder.
Both are optional: where they cannot be built, the install goes on and the Python code they speed up runs
(the collector logs which decoder at start).
 Declared here, not in pyproject's `[tool.setuptools] ext-modules`, which
setuptools still flags as experimental with a warning on every install.
"""

import warnings

from setuptools import Extension, setup

# With an extension module, setuptools' editable install warns about folders named like the package
# (here spanrl/ IS the package's folder, mapped in pyproject.toml): noise on every `make venv`.
warnings.filterwarnings("ignore", message=r"(?s)Editable installation")

setup(
    ext_modules=[
        Extension(
            "spanrl.collector._wire",
            sources=["collector/_wire.c", "collector/wire_text.c", "collector/wire_attrs.c", "collector/wire_spans.c"],
            depends=["collector/wire.h"],
            optional=True,
            # -fvisibility=hidden: the files share plain names (put, span, ...); only PyInit__wire is exported.
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                                "-fvisibility=hidden"],
        ),
        Extension(
            "spanrl.instrumentation._encode",
            sources=["instrumentation/_encode.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        ),
    ],
    # The sdist carries the C sources (for this build); the wheel needs only the built .so. Without this,
    # include-package-data copies the sources (in the sdist's file list) into the wheel too.
    exclude_package_data={"spanrl.collector": ["*.c", "*.h"], "spanrl.instrumentation": ["*.c"]},
)
