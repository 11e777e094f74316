//! One tower layer per concern.
