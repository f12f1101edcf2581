"""ci/function_lengths.py against hand-written sources: what counts as a function and how long it is."""
import importlib.util
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE.parent / "function_lengths.py"
spec = importlib.util.spec_from_file_location("function_lengths", SCRIPT)
fl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fl)


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


SOURCE = (
    "#include <string>\n"
    "#if defined(A) || defined(B)\n"
    "#define F(x) { x }\n"
    "#endif\n"
    "namespace ifec::demo {\n"
    "// a comment with a brace {\n"
    "int short_one(int x) {\n" + body(3) + "  return x;\n}\n"  # 6 lines from its signature to its brace
    "class Op : public Base {\n"
    " public:\n"
    "  void inline_method() const override {\n" + body(5) + "  }\n"  # 7 lines
    "};\n"
    "int long_one(int x, const std::string& s)\n"
    "    noexcept {\n"
    '  const char* t = "}}}";\n'
    "  auto f = [&](int y) {\n" + body(4) + "    return y;\n  };\n"
    "  if (x) {\n" + body(150) + "  }\n"
    "  return f(x);\n}\n"
    "}  // namespace ifec::demo\n"
)


def test_finds_every_function_with_its_length():
    found = {name: length for _, name, length in fl.functions(SOURCE)}
    assert found["short_one"] == 6
    assert found["inline_method"] == 7
    # from its opening brace (the noexcept line): the string, the lambda (7 lines), the if (152), the return, "}"
    assert found["long_one"] == 1 + 1 + 7 + 152 + 1 + 1
    assert len(found) == 3, found  # lambdas, ifs, classes and namespaces are not functions of their own


def test_the_command_names_only_functions_over_the_limit(tmp_path):
    src = tmp_path / "demo.cpp"
    src.write_text(SOURCE)
    r = subprocess.run([sys.executable, str(SCRIPT), "--limit", "120", str(src)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "long_one: 163 lines" in r.stdout and "short_one" not in r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--limit", "200", str(src)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == ""
