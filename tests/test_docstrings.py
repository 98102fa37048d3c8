"""Every public name has a docstring in the house style, and the API reference of the site covers every public name.

The public names are listed by ``docs/public_api.py``, which the site's build (``docs/mkdocs_hooks.py``) uses too:
every name of ``torchformer.__all__`` and ``torchformer.data.__all__``, and the classes, functions and public
methods defined by every non-private module. ``mkdocs build --strict`` fails on the same missing docstrings; this
test says so without MkDocs installed, and checks the style of each (see "The house style" below).
"""

import ast
import functools
import importlib
import importlib.util
import inspect
import io
import pathlib
import re
import textwrap
import tokenize

import pytest
import torch

import torchformer
import torchformer.data
import torchformer.nn.relative

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
spec = importlib.util.spec_from_file_location("public_api", DOCS / "public_api.py")
public_api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(public_api)


def test_every_public_name_has_a_docstring():
    assert public_api.missing_docstrings() == []


def test_the_public_names_include_every_module_and_the_exported_names():
    paths = {path for path, _ in public_api.public_objects()}
    assert "torchformer.nn.attention.SelfAttention" in paths
    assert "torchformer.nn.attention.MultiHeadAttention.from_config" in paths  # a classmethod
    assert "torchformer.train.distributed.wrap_model" in paths
    assert not any(part.startswith("_") for path in paths for part in path.split("."))  # no private name
    modules = public_api.modules()
    assert "torchformer.nn.norms" in modules and "torchformer._checks" not in modules


@pytest.mark.parametrize("package", [torchformer, torchformer.data], ids=lambda p: p.__name__)
def test_every_exported_name_has_a_page_in_the_api_reference(package):
    # The site documents each name on the page of the module that defines it: that module must have a page and
    # list the name.
    for name in package.__all__:
        value = getattr(package, name)
        if inspect.ismodule(value):
            continue
        assert value.__module__ in public_api.modules(), f"{name}: defined in {value.__module__}, which has no page"
        assert name in public_api.defined_names(value.__module__), f"{name} is not on {value.__module__}'s page"


def test_a_name_without_a_docstring_is_reported(monkeypatch):
    # The check itself: remove one docstring and it is named.
    from torchformer.nn.norms import RMSNorm

    monkeypatch.setattr(RMSNorm, "__doc__", None)
    assert public_api.missing_docstrings() == ["torchformer.RMSNorm", "torchformer.nn.norms.RMSNorm"]


# The house style of a docstring (docs/index.md, "Shapes"), checked for every public name that
# ``public_api.public_objects()`` lists, methods included:
#
# * a one-line summary ending in a period, then a blank line before anything else;
# * ``Args:`` naming every argument (a class: its constructor's), one per entry, and nothing else; a class that
#   inherits its constructor from a torchformer class documents the arguments once, where they are defined: it
#   has no ``Args:`` of its own, or a complete one, and without one it names that class (a link for the reader);
#   likewise a class whose own ``__init__`` passes arguments to a torchformer base class's (``super().__init__(...)``
#   with arguments) may list only the arguments that base's constructor lacks (and those it means otherwise), when
#   it names that base class ("Other arguments as :class:`MultiHeadAttention`."): no ``Args:`` if there are none;
# * ``Shapes:`` for a module (an ``nn.Module``): what ``forward`` takes and returns, in the letters b, t, u, e, h, s,
#   c, v (``forward`` itself is not listed, public_api.INHERITED_ROLES: the class's ``Shapes:`` documents it);
# * ``Returns:`` (or ``Yields:``) for a function or method that returns something (annotated other than ``None``),
#   not beginning with "word:", which the site would read as the name of the returned value;
# * a method that overrides a torchformer class's method with the same arguments may, likewise, leave out
#   ``Args:`` and ``Returns:`` when it names that class ("As :meth:`Parent.method`, ..."): its contract is the
#   parent's, documented once;
# * so may a method whose docstring names, in a ``:meth:`` reference, the method of the same name of another
#   torchformer class with the same arguments, which documents them ("As :meth:`FeedForward.from_config`, ..."):
#   a sibling's contract, documented once (sibling_definer); what the sibling's does not say stays, in a line;
# * ``Returns:`` may be left out when the summary is the return value: a noun phrase of what is returned ("The ...",
#   "A ...", "An ...", "Whether ...") or a sentence beginning "Return"/"Returns", as the Google Python Style Guide
#   (section 3.8.3) allows when "the opening sentence is sufficient to describe the return value"
#   (summary_describes_return). A test cannot judge that part: a Returns: that states a shape, a dtype, a device,
#   a layout, the None cases or any other fact of the contract beyond the summary and the annotation stays.
#
# Exempt, and why:
#
# * modules: their docstring is prose (and names the letters it uses); only the summary rule applies;
# * properties: they read as attributes (``cache.empty``), so the summary says what they are: no Args or Returns;
# * a class that inherits its constructor from torch or Python (an exception, an ``nn.Module`` without an
#   ``__init__``): it has no arguments of its own to document;
# * dunder and private names: not public (public_api lists none).
SECTION = re.compile(r"^(\w[\w ]*):\n((?:(?: {4}.*)?\n)+)", re.M)
ENTRY = re.compile(r"^ {4}(\*{0,2}\w+)(?: \([^)]*\))?:", re.M)
# How the site (griffe) reads a name at the start of a Returns: section: "word:" or "word (type):". A description
# that begins "A :class:`X`" (or "The :class:`X`") would lose its first word that way: put the role later ("The
# tokenizer, a :class:`X`"); "(type): ..." (no name) is fine.
NAMED_VALUE = re.compile(r"\w+\s*(?:\(.+\))?:")


def sections(doc: str) -> dict[str, str]:
    return {title: body for title, body in SECTION.findall(inspect.cleandoc(doc) + "\n")}


def own_doc(value) -> str:
    return (value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__) or ""


def constructor_definer(value) -> type | None:
    """The torchformer class whose ``__init__`` the class ``value`` inherits; ``None`` if it defines its own."""
    if "__init__" in value.__dict__:
        return None
    definer = next(base for base in value.__mro__ if "__init__" in base.__dict__)  # object at the latest
    return definer if definer.__module__.startswith("torchformer") else None


def passing_base(value) -> type | None:
    """The torchformer base class whose constructor the class ``value``'s own ``__init__`` passes arguments to.

    ``None`` when ``value`` defines no ``__init__``, when the next constructor up the MRO is not a torchformer class's
    or takes no arguments, or when ``__init__`` calls ``super().__init__()`` without arguments (or not at all).
    """
    init = value.__dict__.get("__init__")
    if not inspect.isfunction(init):
        return None
    base = next(base for base in value.__mro__[1:] if "__init__" in base.__dict__)
    if not base.__module__.startswith("torchformer") or not arguments(base):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except OSError:  # generated (a dataclass's): it calls no base constructor with arguments
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id == "super" and (node.args or node.keywords)):
            return base
    return None


def overridden_definer(value) -> type | None:
    """The torchformer class a method ``value`` overrides with the same arguments; ``None`` for any other value."""
    owner = method_owner(value)
    if owner is None:
        return None
    name = value.__name__
    for base in owner.__mro__[1:]:
        if name in vars(base) and base.__module__.startswith("torchformer"):
            parent = vars(base)[name]
            parent = parent.__func__ if isinstance(parent, (staticmethod, classmethod)) else parent
            same = inspect.isfunction(parent) and arguments(parent) == arguments(value)
            return base if same else None
    return None


# A reference to a method in a docstring: ``:meth:`Cls.name``` or its qualified forms (``~torchformer.nn.x.Cls.name``).
METHOD_REFERENCE = re.compile(r":meth:`~?((?:\w+\.)*\w+)\.(\w+)`")


@functools.cache
def public_classes() -> dict[str, list[type]]:
    """The public torchformer classes (``public_api.public_objects()``) by name."""
    found: dict[str, list[type]] = {}
    for _, value in public_api.public_objects():
        if inspect.isclass(value) and value not in found.setdefault(value.__name__, []):
            found[value.__name__].append(value)
    return found


def referenced_class(path: str, module) -> type | None:
    """The torchformer class ``path`` (``Cls`` or ``package.module.Cls``) names, seen from ``module``; else ``None``."""
    if "." in path:
        module_name, _, name = path.rpartition(".")
        try:
            value = getattr(importlib.import_module(module_name), name, None)
        except ImportError:
            return None
    else:
        value = getattr(module, path, None)  # the method's own module first (its classes, and those it imports)
        if value is None:
            candidates = public_classes().get(path, [])
            value = candidates[0] if len(candidates) == 1 else None  # a name two classes share resolves to neither
    if not inspect.isclass(value) or not value.__module__.startswith("torchformer"):
        return None
    return value


def method_owner(value) -> type | None:
    """The class a method ``value`` is defined in, found by its qualified name; ``None`` for any other value."""
    if not inspect.isfunction(value) or "." not in value.__qualname__ or "<locals>" in value.__qualname__:
        return None
    owner = getattr(inspect.getmodule(value), value.__qualname__.split(".")[0], None)
    return owner if inspect.isclass(owner) else None


def sibling_references(value) -> list[str]:
    """The ``:meth:`` references of ``value``'s docstring to a method of its own name (``Cls.name``, as written)."""
    return [f"{path}.{name}" for path, name in METHOD_REFERENCE.findall(own_doc(value))
            if name == getattr(value, "__name__", None)]


def sibling_definer(value) -> type | None:
    """The other torchformer class whose method of the same name and arguments ``value``'s docstring references.

    A method's docstring that names ``:meth:`Cls.name``` (``name`` its own) defers to that method's contract when
    ``Cls`` is a torchformer class other than its own that defines ``name`` itself, with the same argument list, and
    documents them there (``Args:`` when there are some, and what it returns: a chain of deferring methods documents
    nothing). ``None`` when no reference resolves so.
    """
    return next(filter(None, (resolved_sibling(value, reference) for reference in sibling_references(value))), None)


def resolved_sibling(value, reference: str) -> type | None:
    """The class of ``reference`` (``Cls.name``, in ``value``'s docstring) if its method can stand for ``value``."""
    owner = method_owner(value)
    path, _, name = reference.rpartition(".")
    cls = None if owner is None else referenced_class(path, inspect.getmodule(value))
    if cls is None or cls is owner or name not in vars(cls):
        return None
    sibling = vars(cls)[name]
    sibling = sibling.__func__ if isinstance(sibling, (staticmethod, classmethod)) else sibling
    if not inspect.isfunction(sibling) or arguments(sibling) != arguments(value):
        return None
    documented = sections(own_doc(sibling))
    if arguments(sibling) and "Args" not in documented:
        return None
    if returns_something(sibling) and not ("Returns" in documented or "Yields" in documented
                                           or summary_describes_return(own_doc(sibling))):
        return None
    return cls


def arguments(value) -> list[str]:
    """The argument names a docstring's ``Args:`` must list (``*args``, ``**kwargs`` with their stars)."""
    if inspect.isclass(value):
        init = value.__init__
        if not getattr(init, "__module__", "").startswith("torchformer"):
            return []  # the constructor of object, Exception, nn.Module, ...: no arguments of its own
        function = init
    else:
        function = value
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and "." in function.__qualname__ and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]  # a method's own object or class
    names = []
    for parameter in parameters:
        star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        names.append(star + parameter.name)
    return names


def returns_something(function) -> bool:
    return inspect.signature(function).return_annotation not in (None, "None")


# Summaries that say what is returned (Google Python Style Guide, 3.8.3: "Returns:" may be omitted when the
# docstring starts with "Return"/"Returns" and the opening sentence is sufficient to describe the return value); the
# house style writes them as noun phrases of the value.
RETURN_SUMMARY = ("The ", "A ", "An ", "Whether ", "Return ", "Returns ")


def summary_describes_return(doc: str) -> bool:
    """Whether the summary line of ``doc`` is the return value ("The ...", "Whether ...", "Returns ...")."""
    lines = inspect.cleandoc(doc).splitlines()
    return bool(lines) and lines[0].startswith(RETURN_SUMMARY)


def style_problems(value) -> list[str]:
    """What the docstring of ``value`` lacks of the house style; empty when it has it all."""
    doc = inspect.cleandoc(own_doc(value))
    lines = doc.splitlines()
    problems = []
    if not lines:
        return ["no docstring"]
    if len(lines) > 1 and lines[1].strip():
        problems.append("a summary of more than one line (the summary is one line, then a blank line)")
    elif not lines[0].rstrip().endswith("."):
        problems.append("a summary that does not end in a period")
    if inspect.ismodule(value) or isinstance(value, property):
        return problems
    found = sections(doc)
    expected = arguments(value)
    parent = overridden_definer(value)
    if "Args" not in found and "Returns" not in found:
        if parent is not None and parent.__name__ in doc:  # the parent's contract
            return problems
        if sibling_definer(value) is not None:  # a sibling's contract
            return problems
        if parent is not None:
            return [*problems,
                    f"no Args: or Returns: section and no mention of {parent.__name__}, whose method it overrides"]
    unresolved = "".join(f"; :meth:`{reference}` is no method of another torchformer class with these arguments, "
                         f"documented there" for reference in sibling_references(value)
                         if resolved_sibling(value, reference) is None)
    definer = constructor_definer(value) if inspect.isclass(value) else None
    if expected and definer is not None and "Args" not in found:
        if definer.__name__ not in doc:
            problems.append(f"no Args: section and no mention of {definer.__name__}, whose arguments it takes")
    elif expected and (base := passing_base(value) if inspect.isclass(value) else None) is not None \
            and base.__name__ in doc:  # only the arguments the base's constructor lacks must be listed
        documented = ENTRY.findall(found.get("Args", ""))
        inherited = arguments(base)
        own = [name for name in expected if name not in inherited]
        if [name for name in own if name not in documented] or [name for name in documented if name not in expected]:
            problems.append(f"Args: lists {documented}, the signature has {expected}, of which {base.__name__}'s "
                            f"constructor lacks {own}")
    elif expected:
        documented = ENTRY.findall(found.get("Args", ""))
        if "Args" not in found:
            problems.append(f"no Args: section (arguments {expected}{unresolved})")
        elif sorted(documented) != sorted(expected):
            problems.append(f"Args: lists {documented}, the signature has {expected}")
    if inspect.isclass(value) and issubclass(value, torch.nn.Module) and "Shapes" not in found:
        problems.append("no Shapes: section (a module)")
    if inspect.isfunction(inspect.unwrap(value)) and returns_something(value):
        if "Returns" not in found and "Yields" not in found and not summary_describes_return(doc):
            problems.append(f"no Returns: section (it returns something, and the summary is not the return value, "
                            f"\"The ...\" or \"Whether ...\"{unresolved})")
    named = NAMED_VALUE.match((found.get("Returns") or found.get("Yields") or "").strip())
    if named:
        problems.append(f"a Returns: section that starts {named.group(0)!r}, which the site reads as the name of the "
                        f"returned value (reword it)")
    return problems


def all_style_problems() -> dict[str, list[str]]:
    found = {}
    for path, value in public_api.public_objects():
        problems = style_problems(value)
        if problems:
            found[path] = problems
    return found


def test_every_public_docstring_has_the_house_style():
    problems = all_style_problems()
    report = "\n".join(f"{path}: {'; '.join(found)}" for path, found in sorted(problems.items()))
    assert not problems, f"{len(problems)} docstrings fall short of the house style:\n{report}"


def test_a_docstring_without_its_sections_is_reported(monkeypatch):
    # The check itself: docstrings that lose their sections, or run their summary over two lines, are named with
    # what they lack.
    from torchformer.nn import masks, norms

    monkeypatch.setattr(masks.causal_mask, "__doc__", "Causal mask.")
    monkeypatch.setattr(norms.RMSNorm, "__doc__", "Root mean square\nnormalisation.")
    problems = all_style_problems()
    assert [p.split(" (")[0] for p in problems["torchformer.nn.masks.causal_mask"]] == ["no Args: section",
                                                                                     "no Returns: section"]
    assert [p.split(" (")[0] for p in problems["torchformer.RMSNorm"]] == [
        "a summary of more than one line", "no Args: section", "no Shapes: section"]


def test_a_subclass_documents_its_parents_arguments_by_naming_the_parent(monkeypatch):
    # SelfAttention takes MultiHeadAttention's constructor: without an Args: section of its own it must name the
    # class that documents them; an Args: section it does have must still be complete.
    from torchformer.nn import attention

    monkeypatch.setattr(attention.SelfAttention, "__doc__", "Self-attention.\n\nArguments: as the parent's.\n\n"
                        "Shapes:\n    x (b, t, e) -> (b, t, e)\n")
    assert style_problems(attention.SelfAttention) == [
        "no Args: section and no mention of MultiHeadAttention, whose arguments it takes"]
    monkeypatch.setattr(attention.SelfAttention, "__doc__", "Self-attention.\n\nArguments: as "
                        ":class:`MultiHeadAttention`.\n\nShapes:\n    x (b, t, e) -> (b, t, e)\n")
    assert style_problems(attention.SelfAttention) == []
    monkeypatch.setattr(attention.SelfAttention, "__doc__", "Self-attention.\n\nArgs:\n    emb: width.\n\n"
                        "Shapes:\n    x (b, t, e) -> (b, t, e)\n")
    assert style_problems(attention.SelfAttention)[0].startswith("Args: lists ['emb'], the signature has")


def test_a_subclass_passing_arguments_to_its_base_lists_only_the_ones_the_base_lacks(monkeypatch):
    # HeadRMSNormAttention's __init__ passes emb, heads and **options on to MultiHeadAttention's constructor, which
    # lacks qk_eps and **options. Naming MultiHeadAttention, its Args: may leave out emb and heads, but not qk_eps; an
    # entry the signature lacks is reported too, and without the name of the base every argument is due.
    from torchformer.nn import attention, blocks, moe, norms, qknorm

    cls = qknorm.HeadRMSNormAttention
    signature = "['emb', 'heads', 'qk_eps', '**options']"
    shapes = "\n\nShapes:\n    As :class:`SelfAttention`.\n"
    monkeypatch.setattr(cls, "__doc__", "Normalised.\n\nArgs:\n    qk_eps: eps.\n    **options: "
                        ":class:`MultiHeadAttention`'s." + shapes)
    assert style_problems(cls) == []
    monkeypatch.setattr(cls, "__doc__", "Normalised.\n\nArgs:\n    **options: :class:`MultiHeadAttention`'s." + shapes)
    assert style_problems(cls) == [(f"Args: lists ['**options'], the signature has {signature}, of which "
                                    f"MultiHeadAttention's constructor lacks ['qk_eps', '**options']")]
    monkeypatch.setattr(cls, "__doc__", "Normalised.\n\nArgs:\n    qk_eps: eps.\n    eps: none.\n    **options: "
                        ":class:`MultiHeadAttention`'s." + shapes)
    assert style_problems(cls)[0].startswith("Args: lists ['qk_eps', 'eps', '**options'], the signature has")
    monkeypatch.setattr(cls, "__doc__", "Normalised.\n\nArgs:\n    qk_eps: eps.\n    **options: the rest." + shapes)
    assert style_problems(cls) == [f"Args: lists ['qk_eps', '**options'], the signature has {signature}"]
    # A class whose arguments are all its base's needs no Args: when it names the base.
    monkeypatch.setattr(attention.CrossAttention, "__doc__", "Cross.\n\nArguments: :class:`MultiHeadAttention`'s."
                        + shapes)
    assert style_problems(attention.CrossAttention) == []
    monkeypatch.setattr(attention.CrossAttention, "__doc__", "Cross.\n\nArguments: the parent's." + shapes)
    assert style_problems(attention.CrossAttention)[0].startswith("no Args: section")
    assert passing_base(cls) is attention.MultiHeadAttention
    assert passing_base(qknorm.ProjectionRMSNormAttention) is qknorm.HeadRMSNormAttention
    assert passing_base(blocks.DecoderBlock) is blocks.TransformerBlock
    assert passing_base(attention.SelfAttention) is None  # no __init__ of its own
    assert passing_base(norms.RMSNorm) is None  # its base is torch's
    assert passing_base(moe.Router) is None  # AuxiliaryLosses' constructor takes no arguments


def test_an_overriding_method_documents_its_arguments_by_naming_the_parent(monkeypatch):
    # Rotary.rotate overrides AttentionPositions.rotate with the same arguments: without Args: and Returns: it must
    # name the class whose method documents them. A method with other arguments than its parent's documents them.
    from torchformer.nn import attention, latent, relative

    monkeypatch.setattr(relative.Rotary.rotate, "__doc__", "Rotate the pairs.\n\nAs the parent's.")
    assert style_problems(relative.Rotary.rotate) == [
        "no Args: or Returns: section and no mention of AttentionPositions, whose method it overrides"]
    monkeypatch.setattr(relative.Rotary.rotate, "__doc__", "Rotate the pairs.\n\nAs "
                        ":meth:`AttentionPositions.rotate`.")
    assert style_problems(relative.Rotary.rotate) == []
    assert overridden_definer(relative.Rotary.rotate) is relative.AttentionPositions
    assert overridden_definer(relative.rotate_halves) is None  # a function, not a method
    assert overridden_definer(relative.AttentionPositions.rotate) is None  # defines it
    assert overridden_definer(latent.LatentAttention.arguments_from_config.__func__) is attention.MultiHeadAttention
    assert overridden_definer(WiderRotation.rotate) is None  # an argument of its own: documented here


def test_a_method_documents_its_arguments_by_naming_a_sibling_with_the_same_arguments(monkeypatch):
    # GatedFeedForward is no FeedForward subclass, but its from_config takes FeedForward.from_config's arguments:
    # naming that method in a :meth: reference (short, or qualified) it may leave out Args: and Returns:. A reference
    # to a method with other arguments, or to a class without that method, leaves the normal rule, and says why.
    from torchformer.nn import attention, blocks, feedforward, positions

    method = feedforward.GatedFeedForward.from_config.__func__
    monkeypatch.setattr(method, "__doc__", "As :meth:`FeedForward.from_config`, for the gated units.")
    assert style_problems(method) == []
    assert sibling_definer(method) is feedforward.FeedForward
    monkeypatch.setattr(method, "__doc__", "As :meth:`~torchformer.nn.feedforward.FeedForward.from_config`.")
    assert style_problems(method) == []
    monkeypatch.setattr(method, "__doc__", "As the plain network's, for the gated units.")
    assert [p.split(" (")[0] for p in style_problems(method)] == ["no Args: section", "no Returns: section"]
    # A class without that method: the normal rule, and the reference named in the problem.
    monkeypatch.setattr(method, "__doc__", "As :meth:`RMSNorm.from_config`, for the gated units.")
    problems = style_problems(method)
    assert [p.split(" (")[0] for p in problems] == ["no Args: section", "no Returns: section"]
    assert ":meth:`RMSNorm.from_config` is no method of another torchformer class" in problems[0]
    # A sibling with other arguments (TokenEmbedding.from_config takes num_tokens): the normal rule.
    monkeypatch.setattr(method, "__doc__", "As :meth:`TokenEmbedding.from_config`, for the gated units.")
    assert sibling_definer(method) is None
    assert [p.split(" (")[0] for p in style_problems(method)] == ["no Args: section", "no Returns: section"]
    # A sibling that defers itself documents nothing: no chain.
    no_positions = positions.NoPositions.from_sizes.__func__
    assert sibling_definer(no_positions) is positions.SinusoidalPositions
    monkeypatch.setattr(positions.SinusoidalPositions.from_sizes.__func__, "__doc__",
                        "As :meth:`LearnedPositions.from_sizes`.")
    assert sibling_definer(no_positions) is None
    assert ":meth:`SinusoidalPositions.from_sizes` is no method" in style_problems(no_positions)[0]
    assert sibling_definer(feedforward.gated_hidden_size) is None  # a function, not a method
    assert resolved_sibling(blocks.DecoderBlock.fill_cache, "CrossAttention.fill_cache") is attention.CrossAttention
    assert resolved_sibling(blocks.DecoderBlock.fill_cache, "DecoderBlock.fill_cache") is None  # itself


def test_a_summary_that_is_the_return_value_may_stand_for_returns(monkeypatch):
    # Google's style guide (3.8.3): Returns: may be left out when the opening sentence describes the return value.
    # The house style's summaries of that kind are noun phrases ("The ...", "A ...", "Whether ...") or begin
    # "Return(s)"; a summary in another form ("Compute ...") still needs its Returns: section.
    from torchformer.nn import blocks, masks

    function = masks.causal_mask
    args = "\n\nArgs:\n    t: queries.\n    u: keys.\n    device: where.\n"
    for summary in ("The causal mask.", "A causal mask.", "Returns the causal mask.", "Return the causal mask."):
        monkeypatch.setattr(function, "__doc__", summary + args)
        assert style_problems(function) == [], summary
    for summary in ("Compute the causal mask.", "Causal mask.", "Theoretically a mask.", "``(t, u)`` bool."):
        monkeypatch.setattr(function, "__doc__", summary + args)
        assert [p.split(" (")[0] for p in style_problems(function)] == ["no Returns: section"], summary
    monkeypatch.setattr(blocks.TransformerBlock.needs_final_norm.__func__, "__doc__",
                        "Whether a stack of these blocks ends with a norm.\n\nArgs:\n    config: the architecture.\n")
    assert style_problems(blocks.TransformerBlock.needs_final_norm.__func__) == []
    # The waiver is for Returns: alone: a missing argument is still reported.
    monkeypatch.setattr(function, "__doc__", "The causal mask.\n\nArgs:\n    t: queries.\n")
    assert [p.split(" (")[0] for p in style_problems(function)] == ["Args: lists ['t'], the signature has ['t', 'u', "
                                                                     "'device']"]


class WiderRotation(torchformer.nn.relative.AttentionPositions):
    """A rotation with an argument its parent's lacks (for the test above)."""

    def rotate(self, x, positions, scale):
        """Rotate, then scale."""
        return x * scale


def docstring_and_code_lines(path: pathlib.Path) -> tuple[int, int]:
    """The lines of a file's module, class and function docstrings, and its other lines holding code."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    code = set()
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(docstrings), len(code)


def test_the_building_blocks_hold_more_code_than_docstring():
    # The modules a reader studies (torchformer/nn) keep their docstrings to contracts: at most 0.8 docstring lines
    # (blank ones inside included) per line of code (comments and blank lines not counted); the explanations live
    # on the docs pages.
    sample = pathlib.Path(torchformer.__file__).parent / "nn"
    docstrings, code = map(sum, zip(*(docstring_and_code_lines(path) for path in sample.glob("*.py"))))
    assert docstrings <= 0.8 * code, f"torchformer/nn: {docstrings} docstring lines against {code} of code"


def test_the_line_count_separates_docstrings_comments_and_code(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text('def f(x):\n    """Twice x.\n    """\n    # a comment\n\n    y = (x +\n         x)\n    return y\n')
    assert docstring_and_code_lines(path) == (2, 4)  # def, the two lines of y, return
