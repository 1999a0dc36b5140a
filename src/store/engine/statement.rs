//! Statements over a batch of requests, assembled by one builder: it writes `req` (an array
//! parameter per [`Column`], typed by the Rust value it binds) and binds by the same list, so text
//! and binding agree; the features' SQL parts name columns, never parameter numbers. Each statement
//! has a lone form, the same parts over a `req` of one row, for a batch of one request.

use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgTypeInfo};
use sqlx::{Postgres, TypeInfo};

pub(crate) type QueryAs<'q, O> = sqlx::query::QueryAs<'q, Postgres, O, PgArguments>;

pub(crate) type Bind<J> = fn(&mut PgArguments, &[&J]) -> Result<(), BoxDynError>;

pub(crate) struct Column<J> {
    name: &'static str,
    sql_type: fn() -> PgTypeInfo,
    bind: Bind<J>,
    positional: bool,
}

impl<J> Column<J> {
    pub(crate) const fn new(
        name: &'static str,
        sql_type: fn() -> PgTypeInfo,
        bind: Bind<J>,
    ) -> Self {
        Self {
            name,
            sql_type,
            bind,
            positional: false,
        }
    }

    /// Kept out of `req`: the one-row CTE `positional` holds the batch's whole array, and parts
    /// read request `i`'s value as `p.name[i]`, so a large value (a body) is not copied through
    /// every CTE that carries its request. A column derived by that name is then an array, used
    /// where it is not NULL (the bound one stays in the text, so every parameter has its type).
    pub(crate) fn positional(mut self) -> Self {
        self.positional = true;
        self
    }
}

/// The SQL type of a column binding `values`.
pub(crate) fn element_type<T: sqlx::Type<Postgres>>(_values: &[T]) -> PgTypeInfo {
    T::type_info()
}

/// A [`Column`] named `$name` whose value for request `$j` is `$value`, of that value's SQL type.
macro_rules! column {
    ($job:ty, $name:literal = |$j:ident| $value:expr) => {
        $crate::store::engine::statement::Column::<$job>::new(
            $name,
            || {
                let none: &[&$job] = &[];
                let values = $crate::store::engine::batch::column(none, |$j| $value);
                $crate::store::engine::statement::element_type(&values)
            },
            |args, jobs| {
                sqlx::Arguments::add(
                    args,
                    $crate::store::engine::batch::column(jobs, |$j| $value),
                )
            },
        )
    };
}
pub(crate) use column;

pub(crate) struct Batched<J> {
    text: String,
    lone: String,
    columns: Vec<Column<J>>,
}

impl<J> Batched<J> {
    pub(crate) fn builder(columns: impl IntoIterator<Item = Column<J>>) -> Builder<J> {
        Builder {
            columns: columns.into_iter().collect(),
            derived: Vec::new(),
            parts: Vec::new(),
        }
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The lone form: `req` is one row the planner knows as one, so its generic plan joins by
    /// nested loops and builds no hash table (a single request's statement is ~13 % quicker).
    pub(crate) fn lone_text(&self) -> &str {
        &self.lone
    }

    pub(crate) fn query<'q, O>(&'q self, jobs: &[&J]) -> QueryAs<'q, O>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        let mut args = PgArguments::default();
        for c in &self.columns {
            (c.bind)(&mut args, jobs).expect("a batch's columns encode");
        }
        let text = if jobs.len() == 1 {
            &self.lone
        } else {
            &self.text
        };
        sqlx::query_as_with(text, args)
    }
}

pub(crate) struct Builder<J> {
    columns: Vec<Column<J>>,
    derived: Vec<(&'static str, &'static str)>,
    parts: Vec<&'static str>,
}

impl<J> Builder<J> {
    /// A `req` column computed by `sql` (over `r`), replacing a bound one of its name.
    pub(crate) fn derive(mut self, name: &'static str, sql: &'static str) -> Self {
        self.derived.push((name, sql));
        self
    }

    pub(crate) fn part(mut self, sql: &'static str) -> Self {
        self.parts.push(sql);
        self
    }

    pub(crate) fn build(self) -> Batched<J> {
        let [text, lone] = [false, true].map(|lone| {
            let mut text = self.requests(lone);
            for part in &self.parts {
                text.push_str(part);
            }
            text
        });
        Batched {
            text,
            lone,
            columns: self.columns,
        }
    }

    fn requests(&self, lone: bool) -> String {
        let intro = if lone {
            "-- The one request of a batch of one (src/store/engine/statement.rs): "
        } else {
            "-- The requests of the batch (src/store/engine/statement.rs): "
        };
        let mut text = String::from(intro);
        let params: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .map(|(n, c)| format!("${} {}", n + 1, c.name))
            .collect();
        text.push_str(&wrap(&params.join(", "), intro.len(), "-- "));
        let select: Vec<String> = self
            .columns
            .iter()
            .filter(|c| !c.positional)
            .map(|c| match self.derived.iter().find(|(d, _)| *d == c.name) {
                Some((name, sql)) => format!("{sql} AS {name}"),
                None => format!("r.{}", c.name),
            })
            .chain(
                self.derived
                    .iter()
                    .filter(|(d, _)| !self.columns.iter().any(|c| c.name == *d))
                    .map(|(name, sql)| format!("{sql} AS {name}")),
            )
            .chain(["r.i".to_owned()])
            .collect();
        let array = |n: usize, c: &Column<J>| {
            format!("${}::{}[]", n + 1, (c.sql_type)().name().to_lowercase())
        };
        let arrays: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.positional)
            .map(|(n, c)| array(n, c))
            .collect();
        let names: Vec<&str> = self
            .columns
            .iter()
            .filter(|c| !c.positional)
            .map(|c| c.name)
            .chain(["i"])
            .collect();
        text.push_str("WITH req AS (\n    SELECT ");
        text.push_str(wrap(&select.join(", "), 11, "        ").trim_end());
        if lone {
            let one: Vec<String> = arrays
                .iter()
                .zip(&names)
                .map(|(array, name)| format!("({array})[1] AS {name}"))
                .chain(["1::int8 AS i".to_owned()])
                .collect();
            text.push_str("\n    FROM (SELECT ");
            text.push_str(wrap(&one.join(", "), 18, "        ").trim_end());
            text.push_str(") r),\n");
        } else {
            text.push_str("\n    FROM unnest(");
            text.push_str(wrap(&arrays.join(", "), 16, "        ").trim_end());
            text.push_str(")\n    WITH ORDINALITY AS r(");
            text.push_str(wrap(&names.join(", "), 24, "        ").trim_end());
            text.push_str(")),\n");
        }
        let positional: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.positional)
            .map(
                |(n, c)| match self.derived.iter().find(|(d, _)| *d == c.name) {
                    Some((name, sql)) => format!("coalesce({sql}, {}) AS {name}", array(n, c)),
                    None => format!("{} AS {}", array(n, c), c.name),
                },
            )
            .collect();
        if !positional.is_empty() {
            text.push_str(
                "-- Columns kept out of `req`, each the batch's array: request i's is p.name[i].\n",
            );
            text.push_str("positional AS (\n    SELECT ");
            text.push_str(wrap(&positional.join(", "), 11, "        ").trim_end());
            text.push_str("),\n");
        }
        text
    }
}

fn wrap(list: &str, first: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    let mut budget = 100 - first;
    for word in list.split(' ') {
        if !line.is_empty() && line.len() + word.len() + 1 > budget {
            budget = 100 - indent.len();
            out.push_str(&line);
            out.push('\n');
            out.push_str(indent);
            line.clear();
        } else if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::{Batched, QueryAs};

    struct Job(i64);

    #[test]
    fn a_batch_of_one_request_runs_the_lone_form() {
        let statement = Batched::builder([column!(Job, "n" = |j| j.0)])
            .part("done AS (SELECT 1)\nSELECT r.n FROM req r")
            .build();
        let (one, two) = (Job(1), Job(2));
        let alone: QueryAs<'_, (i64,)> = statement.query(&[&one]);
        assert_eq!(sqlx::Execute::sql(&alone), statement.lone_text());
        let together: QueryAs<'_, (i64,)> = statement.query(&[&one, &two]);
        assert_eq!(sqlx::Execute::sql(&together), statement.text());
        assert!(
            statement
                .lone_text()
                .contains("FROM (SELECT ($1::int8[])[1] AS n, 1::int8 AS i) r")
        );
    }
}
