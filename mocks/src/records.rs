//! The demo records the mocks serve.

use serde_json::{Value, json};

use crate::config::Service;

/// Names given to the first demo users; other ids get a generated name.
const USER_NAMES: [&str; 3] = ["Alice", "Bob", "Carol"];
/// Items the demo orders cycle through.
const ITEMS: [&str; 4] = ["keyboard", "monitor", "headset", "dock"];

/// The demo fields of record `id` of `service` (without the request echo).
pub fn record(service: Service, id: &str) -> Value {
    // A stable number derived from the id, so every id has its own fields.
    let n = id.bytes().fold(0u64, |acc, b| {
        acc.wrapping_mul(31).wrapping_add(u64::from(b))
    });
    match service {
        Service::Users => {
            let name = id
                .parse::<usize>()
                .ok()
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| USER_NAMES.get(i))
                .map_or_else(|| format!("User {id}"), |s| (*s).to_owned());
            json!({
                "id": id,
                "name": name,
                "email": format!("{}@example.com", name.to_lowercase().replace(' ', ".")),
            })
        }
        Service::Orders => json!({
            "id": id,
            "user_id": (n % 3 + 1).to_string(),
            "item": ITEMS[(n % ITEMS.len() as u64) as usize],
            "quantity": n % 5 + 1,
            "total_cents": (n % 5 + 1) * 4_999,
        }),
    }
}

/// The list answered on `GET /users` or `GET /orders`.
pub fn list(service: Service) -> Value {
    Value::Array((1..=3).map(|i| record(service, &i.to_string())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_have_demo_names() {
        assert_eq!(record(Service::Users, "1")["name"], "Alice");
        assert_eq!(record(Service::Users, "2")["email"], "bob@example.com");
        assert_eq!(record(Service::Users, "42")["name"], "User 42");
    }

    #[test]
    fn orders_are_stable_per_id() {
        assert_eq!(record(Service::Orders, "7"), record(Service::Orders, "7"));
        assert_eq!(record(Service::Orders, "7")["id"], "7");
        assert_eq!(list(Service::Orders).as_array().map(Vec::len), Some(3));
    }
}
