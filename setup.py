from setuptools import Extension, setup

fastpath = Extension("storage_c._fastpath", ["storage_c/_fastpath.c"], include_dirs=["storage_c/include"],
                     extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror"])
setup(cffi_modules=["storage_c/_build.py:ffibuilder"], ext_modules=[fastpath])
