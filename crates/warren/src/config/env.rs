//! `${NAME}` expansion in config string values, so secrets can live in the environment
//! instead of the file. `$${` writes a literal `${`; any other `$` is kept as is.

/// Why a string could not be expanded. Never carries the string itself: it may be a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// `${NAME}` names a variable that is not set (or is not valid UTF-8).
    #[error("environment variable {0} is not set")]
    Missing(String),
    /// `${` without a closing `}`.
    #[error("\"${{\" without a closing \"}}\"")]
    Unterminated,
    /// `${...}` whose content is not a variable name.
    #[error("\"${{...}}\" does not contain a valid variable name")]
    BadName,
}

impl EnvError {
    /// How to fix it, for the config error's hint.
    pub fn hint(&self) -> String {
        match self {
            EnvError::Missing(name) => {
                format!("set {name} in warren's environment (export {name}=...) or write the value here")
            }
            EnvError::Unterminated | EnvError::BadName => {
                "write ${NAME} where NAME is letters, digits and _ (not starting with a digit), or $${ for a literal \"${\"".to_owned()
            }
        }
    }
}

/// Replaces every `${NAME}` in `text` with `lookup(NAME)`.
///
/// # Errors
///
/// The first [`EnvError`] in `text`.
pub fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, EnvError> {
    if !text.contains('$') {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(escaped) = after.strip_prefix("${") {
            out.push_str("${");
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').ok_or(EnvError::Unterminated)?;
            let name = &body[..end];
            if !is_var_name(name) {
                return Err(EnvError::BadName);
            }
            let value = lookup(name).ok_or_else(|| EnvError::Missing(name.to_owned()))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// `[A-Za-z_][A-Za-z0-9_]*`
fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Looks a variable up in the process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(name: &str) -> Option<String> {
        (name == "WARREN_TEST_X").then(|| "value".to_owned())
    }

    #[test]
    fn expands_and_escapes() {
        assert_eq!(expand("${WARREN_TEST_X}", &fake), Ok("value".into()));
        assert_eq!(
            expand("a-${WARREN_TEST_X}-b", &fake),
            Ok("a-value-b".into())
        );
        assert_eq!(
            expand("$${WARREN_TEST_X}", &fake),
            Ok("${WARREN_TEST_X}".into())
        );
        assert_eq!(expand("cost: $5 $", &fake), Ok("cost: $5 $".into()));
        assert_eq!(expand("plain", &fake), Ok("plain".into()));
    }

    #[test]
    fn reports_problems() {
        assert_eq!(
            expand("${NOPE}", &fake),
            Err(EnvError::Missing("NOPE".into()))
        );
        assert_eq!(expand("${NOPE", &fake), Err(EnvError::Unterminated));
        assert_eq!(expand("${1X}", &fake), Err(EnvError::BadName));
        assert_eq!(expand("${}", &fake), Err(EnvError::BadName));
        assert_eq!(expand("${A-B}", &fake), Err(EnvError::BadName));
    }
}
