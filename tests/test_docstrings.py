"""Every public function, class, method and property of the library has a docstring: the website's API
reference (docs/) is generated from them, and an object without one would be missing from it.

Public means: defined in a ``moe_course`` module (not imported into it) under a name without a leading
underscore; for a class, its methods and properties defined in its own body. An override may rely on the
docstring of the course's own base class it overrides (``VMoE.make_mlp`` documents ``ViT.make_mlp``), never on
one from another library (``torch.nn.Module.forward``'s text says nothing about the course's layers).
"""

import importlib
import inspect
import pkgutil

import pytest

import moe_course

# Packages that need an optional extra, checked only where it is installed (README command 1 has neither).
OPTIONAL = {"moe_course.torch": ("torch", "moe_course.torch needs PyTorch (the torch extra)"),
            "moe_course.course": ("nbgrader", "moe_course.course needs nbgrader (the instructor extra)")}


def _package_of(name: str) -> str:
    return next((package for package in OPTIONAL if name == package or name.startswith(package + ".")), "moe_course")


def _modules(package: str = "moe_course"):
    """The modules of ``package``: one of OPTIONAL, or "moe_course" for all the rest."""
    names = ["moe_course"] + sorted(i.name for i in pkgutil.walk_packages(moe_course.__path__, "moe_course."))
    return [importlib.import_module(name) for name in names if _package_of(name) == package]


def _own_doc(member) -> str | None:
    function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    return getattr(function, "__doc__", None)


def _inherited_from_course(cls, name: str) -> bool:
    return any(_own_doc(vars(base).get(name)) for base in cls.__mro__[1:]
               if base.__module__.startswith("moe_course") and name in vars(base))


def undocumented(package: str = "moe_course") -> list[str]:
    """Dotted names of the public objects of ``package`` (see ``_modules``) without a docstring."""
    missing = []
    for module in _modules(package):
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if obj.__module__ != module.__name__:
                continue
            if not obj.__doc__:
                missing.append(f"{module.__name__}.{name}")
            if not inspect.isclass(obj):
                continue
            for member_name, member in vars(obj).items():
                if member_name.startswith("_") or not (
                        inspect.isfunction(member) or isinstance(member, (property, staticmethod, classmethod))):
                    continue
                if not _own_doc(member) and not _inherited_from_course(obj, member_name):
                    missing.append(f"{module.__name__}.{name}.{member_name}")
    return missing


@pytest.mark.parametrize("package", ["moe_course", *OPTIONAL])
def test_every_public_object_has_a_docstring(package):
    if package in OPTIONAL:
        module, reason = OPTIONAL[package]
        pytest.importorskip(module, reason=reason)
    missing = undocumented(package)
    assert not missing, f"{len(missing)} public objects without a docstring: {', '.join(missing)}"


def test_the_checker_finds_a_missing_docstring(monkeypatch):
    from moe_course.routing import allocation

    def no_doc():
        pass

    no_doc.__module__ = allocation.__name__
    monkeypatch.setattr(allocation, "undocumented_helper", no_doc, raising=False)
    assert "moe_course.routing.allocation.undocumented_helper" in undocumented()
