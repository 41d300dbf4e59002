//! `[classes]` checked into [`Classes`]: the header that names a request's class, the
//! default class, and per class the scale of the busy thresholds and the share of each
//! worker's engine slots it may fill.

use serde::Serialize;
use toml::Spanned;

use super::file::{FileClass, FileClasses};
use super::validate::Validator;
use super::*;
use crate::shed::Class;

pub const DEFAULT_CLASS_HEADER: &str = "x-spillway-class";

/// What one class may use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClassSettings {
    /// The model's busy thresholds times this, as this class sees them (below 1: busy
    /// earlier, so this class is refused first).
    pub busy_threshold_scale: f64,
    /// The part of each worker's `engine_request_limit` this class may fill (at least
    /// one slot).
    pub slot_share: f64,
}

impl ClassSettings {
    const FULL: ClassSettings = ClassSettings {
        busy_threshold_scale: 1.0,
        slot_share: 1.0,
    };
}

/// Request classes (defaults: `critical` and `standard` use everything, `sheddable` sees
/// workers busy at 80 % of the thresholds and fills at most 75 % of the slots).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Classes {
    /// Request header naming the class, lowercase.
    pub header: String,
    /// The class of requests that name none (or an unknown one) on models without a
    /// `class` of their own.
    pub default: Class,
    pub critical: ClassSettings,
    pub standard: ClassSettings,
    pub sheddable: ClassSettings,
}

impl Default for Classes {
    fn default() -> Self {
        Classes {
            header: DEFAULT_CLASS_HEADER.to_string(),
            default: Class::Standard,
            critical: ClassSettings::FULL,
            standard: ClassSettings::FULL,
            sheddable: ClassSettings {
                busy_threshold_scale: 0.8,
                slot_share: 0.75,
            },
        }
    }
}

impl Classes {
    pub fn get(&self, class: Class) -> &ClassSettings {
        match class {
            Class::Critical => &self.critical,
            Class::Standard => &self.standard,
            Class::Sheddable => &self.sheddable,
        }
    }
}

impl Validator<'_> {
    pub(super) fn classes(&self, f: &FileClasses) -> Result<Classes, ConfigError> {
        let d = Classes::default();
        let header = self.header_name("classes.header", &f.header)?;
        Ok(Classes {
            header: header.unwrap_or(d.header),
            default: match &f.default {
                Some(c) => self.class("classes.default", c)?,
                None => d.default,
            },
            critical: self.class_settings("critical", &f.critical, d.critical)?,
            standard: self.class_settings("standard", &f.standard, d.standard)?,
            sheddable: self.class_settings("sheddable", &f.sheddable, d.sheddable)?,
        })
    }

    /// A class named in the file: one of the known ones (unlike a header's value, a
    /// typo here is the operator's and is refused).
    pub(super) fn class(&self, key: &str, v: &Spanned<String>) -> Result<Class, ConfigError> {
        Class::parse(v.get_ref().as_bytes()).map_or_else(
            || {
                let msg = format!(
                    "unknown class `{}` (expected one of: critical, standard, sheddable)",
                    v.get_ref()
                );
                self.err(key, Some(v.span()), msg)
            },
            Ok,
        )
    }

    fn class_settings(
        &self,
        name: &str,
        f: &Option<FileClass>,
        default: ClassSettings,
    ) -> Result<ClassSettings, ConfigError> {
        let Some(f) = f else {
            return Ok(default);
        };
        let within = |k: &str, v: &Option<Spanned<f64>>, max: f64, default: f64| match v {
            Some(s) if !(*s.get_ref() > 0.0 && *s.get_ref() <= max) => self.err(
                format!("classes.{name}.{k}"),
                Some(s.span()),
                format!("must be greater than 0 and at most {max}"),
            ),
            Some(s) => Ok(*s.get_ref()),
            None => Ok(default),
        };
        Ok(ClassSettings {
            busy_threshold_scale: within(
                "busy_threshold_scale",
                &f.busy_threshold_scale,
                2.0,
                default.busy_threshold_scale,
            )?,
            slot_share: within("slot_share", &f.slot_share, 1.0, default.slot_share)?,
        })
    }
}
