from setuptools import setup

setup(cffi_modules=["storage_c/_build.py:ffibuilder"])
