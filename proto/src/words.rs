//! A macro for closed vocabularies: an enum whose every variant is one spec word, with one serde
//! mapping, `as_str`, `Display` and `FromStr` generated from the same table, so a word is spelled
//! in exactly one place.

/// A word that is not in a vocabulary, as [`std::str::FromStr`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{word:?} is not a {vocabulary}")]
pub struct UnknownWord {
    /// The vocabulary's name, e.g. `task status`.
    pub vocabulary: &'static str,
    /// The word that was given.
    pub word: String,
}

/// Defines a closed vocabulary enum.
///
/// ```text
/// words! {
///     /// Doc.
///     pub enum TaskStatus("task status") {
///         /// Doc.
///         Waiting => "waiting",
///     }
/// }
/// ```
#[macro_export]
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident($vocabulary:literal) {
            $(
                $(#[$vmeta:meta])*
                $variant:ident => $word:literal
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[doc = concat!("`", $word, "`")]
                $variant,
            )*
        }

        impl $name {
            /// Every word of the vocabulary, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The spec's word.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word),* }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::words::UnknownWord;

            fn from_str(word: &str) -> Result<Self, Self::Err> {
                match word {
                    $($word => Ok($name::$variant),)*
                    other => Err($crate::words::UnknownWord { vocabulary: $vocabulary, word: other.to_owned() }),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let word = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(deserializer)?;
                word.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}
