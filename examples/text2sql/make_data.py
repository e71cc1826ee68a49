"""Generate the text-to-SQL example's data, deterministically: a small SQLite company database and
natural-language questions with gold SQL, split train/val by a fixed seed.

    python examples/text2sql/make_data.py            # writes examples/text2sql/data/

Outputs (all committed, < 1 MB together):
    data/company.sqlite     departments, employees, projects, assignments
    data/train.jsonl        {"id", "question", "sql", "template", "difficulty"} one per line
    data/val.jsonl          held-out questions (no template-parameter pair shared with train)
    data/tiny_train.jsonl   the tiny-vocabulary subset: question and SQL made only of words of
    data/tiny_val.jsonl         data/tiny_vocab.txt, tokens separated by spaces, so a word-level
    data/tiny_vocab.txt         tiny model can emit them

Running it twice gives byte-identical files (the test checks it against the committed ones).
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

SEED = 20261130
VAL_FRACTION = 0.2
DATA_DIR = Path(__file__).resolve().parent / "data"
DB_NAME = "company.sqlite"

_DEPARTMENTS = [  # (name, city, budget in euros)
    ("Engineering", "Berlin", 900000),
    ("Sales", "Paris", 400000),
    ("Marketing", "Paris", 350000),
    ("Finance", "London", 300000),
    ("Research", "Berlin", 750000),
    ("Support", "Madrid", 200000),
]
_TITLES = ["Engineer", "Analyst", "Manager", "Designer", "Scientist", "Agent"]
_FIRST = ["Ada", "Alan", "Grace", "Linus", "Margaret", "Dennis", "Barbara", "Ken", "Frances", "Edsger",
          "Donald", "Radia", "Tim", "Karen", "John", "Lynn", "Niklaus", "Shafi", "Guido", "Sophie"]
_LAST = ["Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Ritchie", "Liskov", "Thompson",
         "Allen", "Dijkstra", "Knuth", "Perlman", "Lee", "Jones", "Backus", "Conway", "Wirth", "Goldwasser"]
_PROJECTS = ["Apollo", "Borealis", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Helios", "Iris",
             "Juniper", "Kestrel", "Lumen", "Meridian", "Nimbus", "Orion", "Pulsar"]
_STATUSES = ["active", "done", "paused"]
_YEARS = list(range(2015, 2025))
_N_EMPLOYEES = 60
_N_ASSIGNMENTS = 110

_SCHEMA = """
CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, budget INTEGER NOT NULL);
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dept_id INTEGER NOT NULL REFERENCES departments(id),
                        title TEXT NOT NULL, salary INTEGER NOT NULL, hire_year INTEGER NOT NULL);
CREATE TABLE projects (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dept_id INTEGER NOT NULL REFERENCES departments(id),
                       budget INTEGER NOT NULL, status TEXT NOT NULL);
CREATE TABLE assignments (employee_id INTEGER NOT NULL REFERENCES employees(id),
                          project_id INTEGER NOT NULL REFERENCES projects(id), hours INTEGER NOT NULL,
                          PRIMARY KEY (employee_id, project_id));
"""


def build_database(path: Path, rng: random.Random) -> None:
    """Write the company database to ``path`` (replacing it)."""
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript(_SCHEMA)
    con.executemany("INSERT INTO departments VALUES (?, ?, ?, ?)",
                    [(i + 1, *d) for i, d in enumerate(_DEPARTMENTS)])
    names = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], _N_EMPLOYEES)
    employees = []
    for i, name in enumerate(names):
        dept = 1 + i % len(_DEPARTMENTS) if i < 24 else rng.randint(1, len(_DEPARTMENTS))
        salary = 1000 * rng.randint(40, 140)
        employees.append((i + 1, name, dept, rng.choice(_TITLES), salary, rng.choice(_YEARS)))
    con.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?, ?)", employees)
    projects = [(i + 1, p, 1 + i % len(_DEPARTMENTS), 10000 * rng.randint(5, 60), rng.choice(_STATUSES))
                for i, p in enumerate(_PROJECTS)]
    con.executemany("INSERT INTO projects VALUES (?, ?, ?, ?, ?)", projects)
    pairs = rng.sample([(e, p) for e in range(1, _N_EMPLOYEES + 1) for p in range(1, len(_PROJECTS) + 1)],
                       _N_ASSIGNMENTS)
    con.executemany("INSERT INTO assignments VALUES (?, ?, ?)",
                    [(e, p, 5 * rng.randint(1, 40)) for e, p in sorted(pairs)])
    con.commit()
    con.execute("VACUUM")
    con.close()


# --- Question templates: (name, difficulty, phrasings, sql, parameter generator) -----------------------
# Difficulty 1: one table; 2: a join or an aggregate with a filter; 3: grouping, ordering, subqueries.
_Template = tuple[str, int, list[str], str, Callable[[sqlite3.Connection], Iterator[dict]]]


def _rows(con: sqlite3.Connection, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def _depts(con):  # noqa: ANN001, ANN202
    for (name,) in _rows(con, "SELECT name FROM departments ORDER BY id"):
        yield {"dept": name}


def _cities(con):  # noqa: ANN001, ANN202
    for (city,) in _rows(con, "SELECT DISTINCT city FROM departments ORDER BY city"):
        yield {"city": city}


def _titles(con):  # noqa: ANN001, ANN202
    for title in _TITLES:
        yield {"title": title}


def _years(con):  # noqa: ANN001, ANN202
    for year in _YEARS:
        yield {"year": year}


def _salaries(con):  # noqa: ANN001, ANN202
    for s in range(50000, 140000, 10000):
        yield {"salary": s}


def _statuses(con):  # noqa: ANN001, ANN202
    for status in _STATUSES:
        yield {"status": status}


def _projects(con):  # noqa: ANN001, ANN202
    for (name,) in _rows(con, "SELECT name FROM projects ORDER BY id"):
        yield {"project": name}


def _employees(con):  # noqa: ANN001, ANN202
    for (name,) in _rows(con, "SELECT name FROM employees WHERE id IN (SELECT employee_id FROM assignments) "
                              "ORDER BY id LIMIT 30"):
        yield {"employee": name}


def _dept_years(con):  # noqa: ANN001, ANN202
    for d in _depts(con):
        for year in (2018, 2020, 2022):
            yield {**d, "year": year}


def _ks(con):  # noqa: ANN001, ANN202
    for k in (1, 2, 3, 5):
        yield {"k": k}


def _counts(con):  # noqa: ANN001, ANN202
    for n in (5, 8, 10, 12):
        yield {"n": n}


def _budgets(con):  # noqa: ANN001, ANN202
    for b in (100000, 200000, 300000, 400000, 500000):
        yield {"budget": b}


_JOIN_ED = "FROM employees AS e JOIN departments AS d ON e.dept_id = d.id"

TEMPLATES: list[_Template] = [
    ("count_dept", 2, ["How many employees work in the {dept} department?",
                       "What is the headcount of {dept}?",
                       "Count the people in the {dept} department."],
     f"SELECT COUNT(*) {_JOIN_ED} WHERE d.name = '{{dept}}'", _depts),
    ("names_dept", 2, ["List the names of the employees in {dept}.",
                       "Who works in the {dept} department?",
                       "Give me everyone in {dept}."],
     f"SELECT e.name {_JOIN_ED} WHERE d.name = '{{dept}}'", _depts),
    ("avg_salary_dept", 2, ["What is the average salary in {dept}?",
                            "On average, how much does someone in {dept} earn?"],
     f"SELECT AVG(e.salary) {_JOIN_ED} WHERE d.name = '{{dept}}'", _depts),
    ("earn_more", 1, ["Which employees earn more than {salary}?",
                      "List the employees with a salary above {salary}.",
                      "Who is paid over {salary} euros?"],
     "SELECT name FROM employees WHERE salary > {salary}", _salaries),
    ("hired_in", 1, ["Who was hired in {year}?",
                     "List the employees who joined in {year}.",
                     "Which people started in {year}?"],
     "SELECT name FROM employees WHERE hire_year = {year}", _years),
    ("count_status", 1, ["How many projects are {status}?",
                         "Count the {status} projects."],
     "SELECT COUNT(*) FROM projects WHERE status = '{status}'", _statuses),
    ("projects_dept", 2, ["Name the projects run by the {dept} department.",
                          "Which projects belong to {dept}?"],
     "SELECT p.name FROM projects AS p JOIN departments AS d ON p.dept_id = d.id WHERE d.name = '{dept}'", _depts),
    ("hours_project", 2, ["How many hours in total were logged on project {project}?",
                          "What is the total number of hours worked on {project}?"],
     "SELECT SUM(a.hours) FROM assignments AS a JOIN projects AS p ON a.project_id = p.id "
     "WHERE p.name = '{project}'", _projects),
    ("staff_project", 2, ["Which employees work on project {project}?",
                          "Who is assigned to {project}?"],
     "SELECT e.name FROM employees AS e JOIN assignments AS a ON a.employee_id = e.id "
     "JOIN projects AS p ON a.project_id = p.id WHERE p.name = '{project}'", _projects),
    ("max_salary_title", 1, ["What is the highest salary among {title}s?",
                             "How much does the best paid {title} earn?"],
     "SELECT MAX(salary) FROM employees WHERE title = '{title}'", _titles),
    ("count_title", 1, ["How many employees have the title {title}?",
                        "Count the {title}s."],
     "SELECT COUNT(*) FROM employees WHERE title = '{title}'", _titles),
    ("depts_city", 1, ["Which departments are located in {city}?",
                       "List the departments based in {city}."],
     "SELECT name FROM departments WHERE city = '{city}'", _cities),
    ("count_city", 2, ["How many employees work in {city}?",
                       "What is the number of staff based in {city}?"],
     f"SELECT COUNT(*) {_JOIN_ED} WHERE d.city = '{{city}}'", _cities),
    ("top_paid", 3, ["Who are the {k} best paid employees, highest first?",
                     "List the top {k} salaries' owners in descending order of salary."],
     "SELECT name FROM employees ORDER BY salary DESC, id LIMIT {k}", _ks),
    ("dept_hired_before", 2, ["Which employees of {dept} were hired before {year}?",
                              "List the {dept} staff who joined before {year}."],
     f"SELECT e.name {_JOIN_ED} WHERE d.name = '{{dept}}' AND e.hire_year < {{year}}", _dept_years),
    ("big_depts", 3, ["Which departments have more than {n} employees?",
                      "Name the departments with over {n} people."],
     f"SELECT d.name {_JOIN_ED} GROUP BY d.id HAVING COUNT(*) > {{n}}", _counts),
    ("project_budget", 1, ["Which projects have a budget above {budget}?",
                           "List the projects funded with more than {budget} euros."],
     "SELECT name FROM projects WHERE budget > {budget}", _budgets),
    ("n_projects_employee", 2, ["On how many projects does {employee} work?",
                                "Count the projects {employee} is assigned to."],
     "SELECT COUNT(*) FROM assignments AS a JOIN employees AS e ON a.employee_id = e.id "
     "WHERE e.name = '{employee}'", _employees),
    ("richest_dept", 3, ["Which department has the largest budget?",
                         "Name the department with the biggest budget.",
                         "What department is funded the most?"],
     "SELECT name FROM departments ORDER BY budget DESC LIMIT 1", lambda con: iter([{}])),
    ("above_avg", 3, ["Which employees earn more than the average salary?",
                      "List the people paid above the company average."],
     "SELECT name FROM employees WHERE salary > (SELECT AVG(salary) FROM employees)", lambda con: iter([{}])),
    ("dept_payroll", 3, ["What is the total salary bill of each department?",
                         "Give the payroll per department."],
     f"SELECT d.name, SUM(e.salary) {_JOIN_ED} GROUP BY d.name", lambda con: iter([{}])),
]

# --- The tiny-vocabulary subset ----------------------------------------------------------------------
# Every word of these questions and gold queries is in TINY_VOCAB; SQL tokens are space separated so a
# word-level tokenizer splits them exactly. "dept_id" values are department ids 1..6.
TINY_TEMPLATES: list[tuple[str, str, str]] = [
    ("tiny_count_emp", "count employees in department {d}", "SELECT COUNT(*) FROM employees WHERE dept_id = {d}"),
    ("tiny_names_emp", "names of employees in department {d}", "SELECT name FROM employees WHERE dept_id = {d}"),
    ("tiny_count_proj", "count projects in department {d}", "SELECT COUNT(*) FROM projects WHERE dept_id = {d}"),
    ("tiny_names_proj", "names of projects in department {d}", "SELECT name FROM projects WHERE dept_id = {d}"),
    ("tiny_max_salary", "max salary in department {d}", "SELECT MAX(salary) FROM employees WHERE dept_id = {d}"),
]
TINY_VALUES = [str(d) for d in range(1, len(_DEPARTMENTS) + 1)]


def tiny_vocab() -> list[str]:
    """The words of the tiny subset, sorted: what a word-level tiny model must know."""
    words: set[str] = set(TINY_VALUES)
    for _, question, sql in TINY_TEMPLATES:
        words.update(w for w in (question + " " + sql).split() if w != "{d}")
    return sorted(words)


def _split(items: list[dict], rng: random.Random, key: str) -> tuple[list[dict], list[dict]]:
    """Split so that no (template, parameters) group is in both halves: val asks unseen instances."""
    groups = sorted({it[key] for it in items})
    rng.shuffle(groups)
    n_val = max(1, round(len(groups) * VAL_FRACTION))
    val_groups = set(groups[:n_val])
    return [it for it in items if it[key] not in val_groups], [it for it in items if it[key] in val_groups]


def make_questions(db_path: Path, rng: random.Random) -> list[dict]:
    """All full-set questions whose gold query runs and returns at least one non-NULL row."""
    con = sqlite3.connect(db_path)
    out = []
    for name, difficulty, phrasings, sql_t, params in TEMPLATES:
        for p_index, p in enumerate(params(con)):
            sql = sql_t.format(**p)
            rows = con.execute(sql).fetchall()
            if not rows or rows == [(None,)] or rows == [(0,)]:
                continue
            for phrasing in phrasings:
                out.append({"question": phrasing.format(**p), "sql": sql, "template": name,
                            "difficulty": difficulty, "group": f"{name}/{p_index}"})
    con.close()
    return out


def make_tiny(db_path: Path) -> list[dict]:
    con = sqlite3.connect(db_path)
    out = []
    for name, question, sql_t in TINY_TEMPLATES:
        for d in TINY_VALUES:
            sql = sql_t.format(d=d)
            assert con.execute(sql).fetchall(), sql  # every department has employees and projects
            out.append({"question": question.format(d=d), "sql": sql, "template": name, "difficulty": 1,
                        "group": f"{name}/{d}"})
    con.close()
    return out


def _write_jsonl(path: Path, items: list[dict], prefix: str) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i, it in enumerate(items):
            row = {"id": f"{prefix}-{i:04d}", **{k: v for k, v in it.items() if k != "group"}}
            f.write(json.dumps(row, sort_keys=True) + "\n")


def main(out_dir: Path = DATA_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    db = out_dir / DB_NAME
    build_database(db, rng)
    train, val = _split(make_questions(db, rng), rng, "group")
    _write_jsonl(out_dir / "train.jsonl", train, "train")
    _write_jsonl(out_dir / "val.jsonl", val, "val")
    # The tiny subset holds out by department within each template, so val asks known shapes with
    # a value combination never seen with that shape.
    tiny = make_tiny(db)
    tiny_val = [t for t in tiny if (TINY_TEMPLATES.index(next(x for x in TINY_TEMPLATES if x[0] == t["template"]))
                                    + int(t["sql"].split()[-1])) % 5 == 0]
    tiny_train = [t for t in tiny if t not in tiny_val]
    _write_jsonl(out_dir / "tiny_train.jsonl", tiny_train, "tiny-train")
    _write_jsonl(out_dir / "tiny_val.jsonl", tiny_val, "tiny-val")
    (out_dir / "tiny_vocab.txt").write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")
    print(f"{db} ({db.stat().st_size} bytes): {len(train)} train, {len(val)} val, "
          f"{len(tiny_train)} tiny train, {len(tiny_val)} tiny val questions", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA_DIR)
