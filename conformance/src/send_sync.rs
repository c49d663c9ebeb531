//! Compile-time checks of `Send` and `Sync`, so that a type's documented thread safety cannot
//! change by accident.
//!
//! This module owns the two assertion macros every crate's tests use.

/// Fails to compile unless every type is `Send` (`send: ...`) or `Send + Sync`
/// (`send_sync: ...`).
#[macro_export]
macro_rules! assert_thread_safe {
    (send: $($t:ty),* $(,)?) => {
        const _: fn() = || {
            fn check<T: ::std::marker::Send + ?Sized>() {}
            $( check::<$t>(); )*
        };
    };
    (send_sync: $($t:ty),* $(,)?) => {
        const _: fn() = || {
            fn check<T: ::std::marker::Send + ::std::marker::Sync + ?Sized>() {}
            $( check::<$t>(); )*
        };
    };
}

/// Fails to compile if a type is `Send` (`not_send: ...`) or `Sync` (`not_sync: ...`): the
/// method call below is ambiguous exactly when both blanket impls apply.
#[macro_export]
macro_rules! assert_not_thread_safe {
    (not_send: $($t:ty),* $(,)?) => {
        const _: fn() = || {
            trait AmbiguousIfSend<A> {
                fn some_item() {}
            }
            impl<T: ?Sized> AmbiguousIfSend<()> for T {}
            impl<T: ?Sized + ::std::marker::Send> AmbiguousIfSend<u8> for T {}
            $( let _ = <$t as AmbiguousIfSend<_>>::some_item; )*
        };
    };
    (not_sync: $($t:ty),* $(,)?) => {
        const _: fn() = || {
            trait AmbiguousIfSync<A> {
                fn some_item() {}
            }
            impl<T: ?Sized> AmbiguousIfSync<()> for T {}
            impl<T: ?Sized + ::std::marker::Sync> AmbiguousIfSync<u8> for T {}
            $( let _ = <$t as AmbiguousIfSync<_>>::some_item; )*
        };
    };
}
